r"""Images shown inline in a terminal: which graphics protocol it speaks, and the escape codes.

Two protocols are spoken:

- **kitty** (kitty, Ghostty): an APC sequence ``ESC _ G <keys> ; <base64> ESC \\`` per chunk of
  at most :data:`KITTY_CHUNK` base64 bytes (a multiple of 4 except the last); the first chunk
  says transmit-and-display (``a=T``) a PNG (``f=100``) and every chunk says ``q=2`` (no
  replies: a reply arrives on stdin, where the approval prompt reads answers) and ``m=1``
  (more follows) or ``m=0`` (last). Only PNG is sent: that is the one format the protocol
  takes as a file.
- **iterm** (iTerm2, WezTerm): one OSC sequence ``ESC ] 1337 ; File=inline=1;size=<bytes> :
  <base64> BEL``, for PNG, JPEG and GIF.

Nothing from an event enters a sequence except the image's bytes, base64-encoded here: the
keys are constants and numbers computed here (no file name, no mime type), so a hostile event
cannot smuggle escape codes to the terminal.

:func:`detect` picks a protocol from the environment for ``--inline-images auto``. WezTerm
speaks both; it gets iterm, because its kitty support is off unless configured and has not
honoured reply suppression, and a reply would type into the approval prompt.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Literal, get_args

from sunroom.errors import UsageError

__all__ = [
    "KITTY_CHUNK",
    "MAX_INLINE_BYTES",
    "MAX_INLINE_IMAGES",
    "MODES",
    "Protocol",
    "detect",
    "escape",
    "refusal",
]

Protocol = Literal["kitty", "iterm"]
Mode = Literal["auto", "kitty", "iterm", "off"]
MODES: tuple[str, ...] = get_args(Mode)

KITTY_CHUNK = 4096
"""The most base64 bytes in one kitty escape sequence (the protocol's own limit)."""
MAX_INLINE_BYTES = 4 * 1024 * 1024
"""A larger image (decoded bytes) is not sent inline: 4 MiB is ~5.6 MB of escape codes."""
MAX_INLINE_IMAGES = 32
"""At most this many images are shown inline by one view; later ones are a line each."""

_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}
_FORMATS: dict[Protocol, tuple[str, ...]] = {
    "kitty": ("image/png",),
    "iterm": ("image/png", "image/jpeg", "image/gif"),
}


def detect(mode: str, env: Mapping[str, str], *, is_terminal: bool) -> Protocol | None:
    """The protocol for ``--inline-images`` *mode* (auto, kitty, iterm, off), or None.

    Raises UsageError for another *mode*. None when *mode* is ``off`` or the output is not a
    terminal, whatever the mode. ``auto`` reads *env*: kitty when ``TERM`` contains ``kitty``
    or ``TERM_PROGRAM`` is ``ghostty``; iterm when ``TERM_PROGRAM`` is ``iTerm.app`` or
    ``WezTerm`` or ``LC_TERMINAL`` is ``iTerm2``; None inside tmux or screen (``TMUX``,
    ``STY``, a ``TERM`` of ``screen*`` or ``tmux*``: they swallow these sequences unless
    passthrough is set up), and None for any other terminal. An explicit kitty or iterm is
    obeyed as asked.
    """
    if mode not in MODES:
        raise UsageError(f"--inline-images must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off" or not is_terminal:
        return None
    if mode == "kitty":
        return "kitty"
    if mode == "iterm":
        return "iterm"
    term = env.get("TERM", "")
    if env.get("TMUX") or env.get("STY") or term.startswith(("screen", "tmux")):
        return None
    program = env.get("TERM_PROGRAM", "")
    if "kitty" in term or program == "ghostty":
        return "kitty"
    if program in ("iTerm.app", "WezTerm") or env.get("LC_TERMINAL") == "iTerm2":
        return "iterm"
    return None


def refusal(protocol: Protocol, mime: str, image: bytes, *, shown: int) -> str | None:
    """Why *image* (of type *mime*) is not shown inline with *protocol*, or None if it is.

    *shown* is how many images this view has shown inline already.
    """
    if mime not in _FORMATS[protocol]:
        return f"{protocol} shows {', '.join(_FORMATS[protocol])} inline, not {mime}"
    if not image.startswith(_MAGIC[mime]):
        return f"the bytes are not a {mime} image"
    if len(image) > MAX_INLINE_BYTES:
        return f"over the {MAX_INLINE_BYTES:,}-byte inline limit"
    if shown >= MAX_INLINE_IMAGES:
        return f"{MAX_INLINE_IMAGES} images were shown inline already"
    return None


def escape(protocol: Protocol, image: bytes) -> str:
    """The escape codes that show *image* at the cursor, then end the line.

    Call :func:`refusal` first: this encodes whatever it is given.
    """
    data = base64.standard_b64encode(image).decode("ascii")
    if protocol == "iterm":
        return f"\x1b]1337;File=inline=1;size={len(image)}:{data}\x07\n"
    chunks = [data[i : i + KITTY_CHUNK] for i in range(0, len(data), KITTY_CHUNK)] or [""]
    out = []
    for i, chunk in enumerate(chunks):
        keys = "a=T,f=100," if i == 0 else ""
        more = int(i < len(chunks) - 1)
        out.append(f"\x1b_G{keys}q=2,m={more};{chunk}\x1b\\")
    return "".join(out) + "\n"
