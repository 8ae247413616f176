"""The matplotlib backend of a kernel: Agg for drawing, ``show()`` emits display items.

The kernel starts with ``MPLBACKEND=module://sunroom.prelude.mplbackend``; matplotlib imports
this module only when a cell uses pyplot, and reads ``FigureCanvas`` (Agg's canvas, looked up
lazily so that this module itself imports nothing of matplotlib) and ``show``.
"""

from __future__ import annotations

from sunroom.prelude.display import show

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

__all__ = ["show"]  # and FigureCanvas, looked up lazily by __getattr__


def __getattr__(name: str) -> Any:
    if name == "FigureCanvas":
        from matplotlib.backends.backend_agg import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
            FigureCanvasAgg,
        )

        # a module attribute from now on: pyplot copies the module's vars() into its backend
        globals()["FigureCanvas"] = FigureCanvasAgg
        return FigureCanvasAgg
    raise AttributeError(name)
