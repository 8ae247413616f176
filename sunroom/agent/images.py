"""Display items of a cell, as the model sees them in the next turn.

Every display item gets one text line in the cell's output (its ``text/plain``, and what became
of its image). Images (PNG, JPEG, GIF, WebP) go to the model as
:class:`~sunroom.providers.ImagePart` in a user message after the cell's output, within a
per-turn :class:`ImageBudget` (count and bytes, over all the cells of the turn); an image over
the budget, or for a model that takes no images (``Model.accepts_images = False``), is a
placeholder line instead. Image bytes cannot be redacted: they are sent as the kernel made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, final

from sunroom.providers import ImagePart
from sunroom.sandbox.result import DisplayItem

IMAGE_MIMES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""Mime types sent to the model as images, in order of preference within one item."""

IMAGES_INTRO: Final = "Images your code displayed, in order:"
"""The text of the user message that carries a turn's images after its tool results."""

MAX_PLAIN_LINE: Final = 2_000
"""Characters of an item's ``text/plain`` shown in its line."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ImageBudget:
    """Most images, and image bytes, sent to the model in one turn."""

    count: int = 4
    bytes: int = 5_000_000


@final
@dataclass(slots=True)
class TurnImages:
    """The images of one turn, gathered cell by cell within *budget*."""

    budget: ImageBudget
    accepts_images: bool = True
    parts: list[ImagePart] = field(default_factory=list)
    _bytes: int = 0

    def take(self, outputs: tuple[DisplayItem, ...], dropped: int = 0) -> list[str]:
        """Gather the images of one cell's *outputs*; return one line per item for its text."""
        lines: list[str] = []
        for item in outputs:
            data = item.data
            plain = str(data.get("text/plain", ""))[:MAX_PLAIN_LINE]
            mime = next((m for m in IMAGE_MIMES if isinstance(data.get(m), bytes)), None)
            if mime is None:
                lines.append(f"[display] {plain}")
                continue
            image: bytes = data[mime]
            size = f"{mime}, {len(image):,} bytes"
            if not self.accepts_images:
                lines.append(f"[display: an image ({size}); this model takes no images] {plain}")
            elif (
                len(self.parts) >= self.budget.count or self._bytes + len(image) > self.budget.bytes
            ):
                lines.append(
                    f"[display: an image ({size}) not shown: the turn's image budget "
                    f"({self.budget.count} images, {self.budget.bytes:,} bytes) is used up] {plain}"
                )
            else:
                self.parts.append(ImagePart(image, media_type=mime))
                self._bytes += len(image)
                lines.append(f"[display: image {len(self.parts)} ({size}), attached] {plain}")
        if dropped:
            lines.append(f"[{dropped} display items were dropped by the kernel's caps]")
        return lines
