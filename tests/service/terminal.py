"""Reading terminal graphics escape codes back: the images a rendered view sent, checked."""

from __future__ import annotations

import base64
import re

from sunroom.cli.terminal_images import KITTY_CHUNK

__all__ = ["ITERM", "KITTY", "iterm_images", "kitty_images"]

KITTY = re.compile(r"\x1b_G([^;\x1b]*);([^\x1b]*)\x1b\\")
ITERM = re.compile(r"\x1b\]1337;File=([^:\x07\x1b]*):([^\x07\x1b]*)\x07")


def kitty_images(text: str) -> list[bytes]:
    """The images in *text*'s kitty sequences, checking each transmission's chunking."""
    images: list[bytes] = []
    payload: list[str] | None = None
    for keys_text, chunk in KITTY.findall(text):
        keys = dict(k.split("=") for k in keys_text.split(","))
        assert len(chunk) <= KITTY_CHUNK
        if payload is None:  # the first chunk of an image says what it is
            assert keys.pop("a") == "T" and keys.pop("f") == "100"
            payload = []
        assert set(keys) == {"q", "m"} and keys["q"] == "2"
        payload.append(chunk)
        if keys["m"] == "0":
            images.append(base64.b64decode("".join(payload), validate=True))
            payload = None
        else:
            assert keys["m"] == "1" and len(chunk) % 4 == 0
    assert payload is None, "a transmission was left open (no m=0 chunk)"
    return images


def iterm_images(text: str) -> list[bytes]:
    """The images in *text*'s iTerm2 sequences, checking that each says its size in bytes."""
    images = []
    for keys_text, data in ITERM.findall(text):
        image = base64.b64decode(data, validate=True)
        keys = dict(k.split("=") for k in keys_text.split(";"))
        assert keys == {"inline": "1", "size": str(len(image))}
        images.append(image)
    return images
