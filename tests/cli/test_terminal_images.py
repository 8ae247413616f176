"""Images shown inline in the live view: real PNG/JPEG bytes through the Renderer, parsed back."""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from rich.console import Console

from sunroom.cli.console import Renderer
from sunroom.cli.terminal_images import (
    MAX_INLINE_BYTES,
    MAX_INLINE_IMAGES,
    Protocol,
    detect,
)
from sunroom.errors import UsageError
from sunroom.store import StoredEvent
from tests.service.terminal import KITTY, iterm_images, kitty_images


def picture(size: tuple[int, int], fmt: str = "PNG", *, noise: bool = True) -> bytes:
    """A real image made by Pillow: random pixels (they do not compress) or a flat colour."""
    rng = random.Random(size[0] * 7919 + size[1])
    if noise:
        img = Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3))
    else:
        img = Image.new("RGB", size, (200, 60, 30))
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def cell(*images: tuple[str, bytes]) -> StoredEvent:
    """An ExecutionFinished event whose cell displayed *images* (mime, bytes)."""
    outputs = [
        {"data": {mime: base64.b64encode(data).decode(), "text/plain": "<Figure>"}, "metadata": {}}
        for mime, data in images
    ]
    payload: dict[str, Any] = {
        "status": "ok", "duration_s": 0.1, "output": "", "outputs": outputs,
    }  # fmt: skip
    return StoredEvent(session_id="s", seq=1, kind="ExecutionFinished", payload=payload, ts=0.0)


def render(inline: Protocol | None, event: StoredEvent, images: Path | None = None) -> str:
    out = io.StringIO()
    renderer = Renderer(Console(file=out, force_terminal=True, width=200), images=images,
                        inline=inline)  # fmt: skip
    renderer.show(event)
    renderer.close()
    return out.getvalue()


def test_kitty_sends_the_exact_png_in_chunks_of_at_most_4096_bytes() -> None:
    png = picture((120, 100))  # ~36 KB: a dozen chunks
    small = picture((8, 8), noise=False)  # one chunk
    text = render("kitty", cell(("image/png", png), ("image/png", small)))
    assert len(KITTY.findall(text)) > 10
    assert kitty_images(text) == [png, small]
    assert f"image/png, {len(png):,} bytes" in text
    assert "\x1b]1337" not in text


def test_iterm_sends_png_jpeg_and_gif_with_their_byte_count() -> None:
    sent = [
        ("image/png", picture((60, 40))),
        ("image/jpeg", picture((60, 40), "JPEG")),
        ("image/gif", picture((20, 20), "GIF", noise=False)),
    ]
    text = render("iterm", cell(*sent))
    assert iterm_images(text) == [image for _, image in sent]
    assert "\x1b_G" not in text


def test_kitty_leaves_other_types_and_false_pngs_as_lines() -> None:
    jpeg = picture((30, 30), "JPEG")
    text = render("kitty", cell(("image/jpeg", jpeg), ("image/png", jpeg)))
    assert not KITTY.findall(text)
    assert "not shown inline: kitty shows image/png inline, not image/jpeg" in text
    assert "not shown inline: the bytes are not a image/png image" in text


def test_an_image_over_the_inline_limit_is_a_line_that_says_why() -> None:
    big = picture((1300, 1100))  # random pixels: ~4.3 MB of PNG
    assert len(big) > MAX_INLINE_BYTES
    for protocol in ("kitty", "iterm"):
        text = render(protocol, cell(("image/png", big)))
        assert "\x1b_G" not in text and "\x1b]1337" not in text
        assert f"over the {MAX_INLINE_BYTES:,}-byte inline limit" in text.replace("\n", "")


def test_at_most_the_cap_of_images_is_shown_inline_by_one_view() -> None:
    png = picture((4, 4), noise=False)
    text = render("kitty", cell(*[("image/png", png)] * (MAX_INLINE_IMAGES + 2)))
    assert len(kitty_images(text)) == MAX_INLINE_IMAGES
    assert text.count(f"{MAX_INLINE_IMAGES} images were shown inline already") == 2


def test_shown_inline_and_saved_to_the_folder(tmp_path: Path) -> None:
    png = picture((50, 50))
    text = render("iterm", cell(("image/png", png)), images=tmp_path / "imgs")
    saved = tmp_path / "imgs" / "image-001.png"
    assert saved.read_bytes() == png
    assert iterm_images(text) == [png]
    assert str(saved) in text.replace("\n", "")


def test_nothing_from_the_event_but_image_bytes_reaches_an_escape_sequence() -> None:
    hostile = "\x1b]1337;File=inline=1:AAAA\x07\x1b_Ga=d\x1b\\"
    event = cell()
    event.payload["outputs"] = [
        {"data": {"image/png": hostile}, "metadata": {"name": hostile}},
        {"data": {"image/x-evil\x1b]": base64.b64encode(picture((4, 4))).decode()}},
    ]
    text = render("kitty", event)
    assert "\x1b]1337" not in text and "\x1b_G" not in text
    assert "not valid base64, not saved" in text


def test_off_or_not_a_terminal_shows_nothing_inline() -> None:
    png = picture((10, 10))
    assert "\x1b" not in render(None, cell(("image/png", png))).replace("\x1b[", "")
    for mode in ("auto", "kitty", "iterm", "off"):
        assert detect(mode, {"TERM": "xterm-kitty"}, is_terminal=False) is None
    piped = Console(file=io.StringIO(), _environ={})
    assert detect("kitty", {}, is_terminal=piped.is_terminal) is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TERM": "xterm-kitty"}, "kitty"),
        ({"TERM": "xterm-ghostty", "TERM_PROGRAM": "ghostty"}, "kitty"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "iTerm.app"}, "iterm"),
        ({"TERM": "xterm-256color", "LC_TERMINAL": "iTerm2"}, "iterm"),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "WezTerm"}, "iterm"),
        ({"TERM": "xterm-256color"}, None),
        ({"TERM": "xterm-256color", "TERM_PROGRAM": "vscode"}, None),
        ({}, None),
        ({"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, None),
        ({"TERM": "tmux-256color", "TERM_PROGRAM": "tmux"}, None),
        ({"TERM": "screen.xterm-256color", "LC_TERMINAL": "iTerm2"}, None),
        ({"TERM": "xterm-kitty", "STY": "1234.pts-0.host"}, None),
    ],
)
def test_auto_detection(env: dict[str, str], expected: str | None) -> None:
    assert detect("auto", env, is_terminal=True) == expected


def test_explicit_modes_and_a_bad_one() -> None:
    assert detect("kitty", {}, is_terminal=True) == "kitty"
    assert detect("iterm", {"TMUX": "x"}, is_terminal=True) == "iterm"
    assert detect("off", {"TERM": "xterm-kitty"}, is_terminal=True) is None
    with pytest.raises(UsageError, match="--inline-images must be one of auto, kitty"):
        detect("sixel", {}, is_terminal=True)
