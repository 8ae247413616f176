"""The matplotlib backend of a kernel: Agg for drawing, ``show()`` emits display items.

The kernel starts with ``MPLBACKEND=module://sunroom.prelude.mplbackend``; matplotlib imports
this module only when a cell uses pyplot, and reads ``FigureCanvas`` (built lazily so that this
module itself imports nothing of matplotlib) and ``show``.

``FigureCanvas`` is Agg's canvas drawing with renderers from :data:`display.RENDERERS`: the
renderer of a figure the kernel captured and closed is reused by the next figure of the same
size and dpi, so matplotlib's text-metrics cache (kept per renderer) still holds the tick
labels' sizes, and a new figure draws about 10% faster. A renderer belongs to one figure at a
time: it returns to the pool only when its figure is captured and closed.
"""

from __future__ import annotations

from sunroom.prelude import display
from sunroom.prelude.display import show

__all__ = ["show"]  # and FigureCanvas, built lazily by __getattr__


def _canvas_class() -> object:
    from matplotlib.backends.backend_agg import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        FigureCanvasAgg,
        RendererAgg,
    )

    class FigureCanvas(FigureCanvasAgg):  # type: ignore[misc, valid-type, unused-ignore]
        """Agg's canvas; a new renderer comes from the pool when one of its size is free."""

        def get_renderer(self) -> object:
            width, height = self.get_width_height(physical=True)
            key = (width, height, self.figure.dpi)
            if self._lastKey != key:
                renderer = display.RENDERERS.take(key)
                self.renderer = renderer or RendererAgg(width, height, self.figure.dpi)  # type: ignore[no-untyped-call, unused-ignore]
                self._lastKey = key
            return self.renderer

        def release_renderer(self) -> None:
            """Give the renderer back to the pool (the figure was captured and is closing)."""
            renderer = self.__dict__.pop("renderer", None)
            if renderer is not None and self._lastKey is not None:
                display.RENDERERS.give(self._lastKey, renderer)
            self._lastKey = None

    return FigureCanvas


def __getattr__(name: str) -> object:
    if name == "FigureCanvas":
        canvas = _canvas_class()
        # a module attribute from now on: pyplot copies the module's vars() into its backend
        globals()["FigureCanvas"] = canvas
        return canvas
    raise AttributeError(name)
