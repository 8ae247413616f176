"""Rich display inside the kernel: ``display()``, mime bundles, and matplotlib figures.

``display(obj, ...)`` (a builtin in every kernel) turns each object into a mime bundle the way
Jupyter does: ``_repr_mimebundle_(include, exclude)`` first, then ``_repr_png_``,
``_repr_jpeg_``, ``_repr_svg_``, ``_repr_html_``, ``_repr_markdown_``, ``_repr_json_`` and
``_repr_latex_``, then the formatters added with :func:`add_formatter` (each for a mime type
the repr methods did not give), and always ``text/plain`` (the repr). A repr method or
formatter that raises or returns the wrong type is left out of the bundle, and the item's
metadata says why (``metadata["sunroom"]["errors"]``): a bad repr never fails the cell. Binary
images are bytes (a base64 ``str`` from a repr method is decoded, as IPython does).
``display(bundle, raw=True)`` shows a mime dict as it is (IPython's ``raw=True``).

A cell's trailing value is shown by :func:`show_result` when it has a repr method beyond
``text/plain`` or a formatter gives it a mime type; its item is marked
``metadata["sunroom"]["execute_result"] = True`` (Jupyter's ``execute_result``, as against
``display_data``), next to any ``errors``.

The items of one cell are kept in order within two caps: ``MAX_ITEMS`` items, and the cell's
byte cap (the ``max_display_bytes`` of the execute request) over all items, an item counting
the lengths of its values. What does not fit is dropped and counted.

matplotlib: the kernel starts with ``MPLBACKEND`` naming :mod:`sunroom.prelude.mplbackend`
(Agg, no display server), so nothing of matplotlib loads unless the cell imports it. At the end
of each cell, if ``matplotlib.pyplot`` was imported, every open figure is rendered as a PNG item
and closed; ``plt.show()`` does the same at once. Standard library only.
"""

from __future__ import annotations

import binascii
import builtins
import sys
from functools import partial

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from collections.abc import Callable, Sized
    from typing import Any, Final

MAX_ITEMS: Final = 100
"""Display items kept per cell; the rest are dropped and counted."""

DEFAULT_MAX_BYTES: Final = 8 << 20
"""The byte cap over one cell's items when the request names none."""

MAX_VALUES: Final = 50_000
"""Values (strings, numbers, list and map entries) over one cell's items: the execute result
travels in one frame, which holds at most 131,072 values."""

_TEXT_REPRS: Final = (
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
)
_BINARY_REPRS: Final = (("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"))
_MAX_REPR: Final = 20_000

_FORMATTERS: dict[str, Callable[[object], object]] = {}
"""Extra mime types for displayed objects, by mime type (:func:`add_formatter`)."""


class Outputs:
    """The display items of the cell that is running (one per kernel)."""

    def __init__(self) -> None:
        self.items: list[dict[str, object]] = []
        self.dropped = 0
        self._cap = DEFAULT_MAX_BYTES
        self._used = 0
        self._values = 0

    def begin(self, cap: int) -> None:
        """Start a cell whose items may hold *cap* bytes in all."""
        self.items, self.dropped, self._cap, self._used, self._values = [], 0, cap, 0, 0

    def add(self, data: dict[str, object], metadata: dict[str, object]) -> None:
        """Keep one item, or count it as dropped when it would pass a cap."""
        size = sum(_size(v) for v in data.values()) + _size(metadata)
        values = _count(data) + _count(metadata)
        if (
            len(self.items) >= MAX_ITEMS
            or self._used + size > self._cap
            or self._values + values > MAX_VALUES
        ):
            self.dropped += 1
            return
        self._used += size
        self._values += values
        self.items.append({"output_type": "display_data", "data": data, "metadata": metadata})

    def end(self) -> tuple[list[dict[str, object]], int]:
        """The cell's items and how many were dropped (the runtime captured its figures)."""
        items, dropped = self.items, self.dropped
        self.items, self.dropped, self._used, self._values = [], 0, 0, 0
        return items, dropped


OUTPUTS = Outputs()


def _size(value: object) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    return len(repr(value))  # application/json, metadata: close enough to the encoded size


def _count(value: object, depth: int = 0) -> int:
    """How many msgpack values *value* is (checked JSON-like data: bounded depth)."""
    if isinstance(value, dict):
        return 1 + sum(1 + _count(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return 1 + sum(_count(v, depth + 1) for v in value)
    return 1


def display(*objs: object, raw: bool = False, metadata: dict[str, object] | None = None) -> None:
    """Show each object as a rich output of this cell (Jupyter's display protocol).

    With *raw*, each object is already a mime bundle (``{"text/latex": "$x$"}``) and is shown
    as it is: a value of the wrong type for its mime type is left out, with the reason in the
    item's metadata, and a bundle without ``text/plain`` gets an empty one (every item carries
    it). *metadata* is merged into each item's metadata.
    """
    for obj in objs:
        data, meta = raw_bundle(obj) if raw else bundle(obj)
        if metadata:
            meta = {**meta, **metadata}
        OUTPUTS.add(data, meta)


def show_result(obj: object) -> None:
    """Show a cell's trailing value as an item marked ``execute_result``, when it is rich.

    Rich: it has a repr method beyond ``text/plain`` (:func:`has_rich_repr`) or a formatter
    gives it a mime type (or fails on it). A plain value adds nothing: its repr is the
    cell's ``value``.
    """
    data: dict[str, object] = {}
    meta: dict[str, object] = {}
    errors: dict[str, str] = {}
    rich = has_rich_repr(obj)
    if rich:
        _from_mimebundle(obj, data, meta, errors)
        _from_repr_methods(obj, data, meta, errors)
    _from_formatters(obj, data, meta, errors)
    if not rich and not data and not errors:
        return
    OUTPUTS.add(*_finish(obj, data, meta, errors, {"execute_result": True}))


def add_formatter(mime: str, formatter: Callable[[object], object]) -> None:
    """Give displayed objects the mime type *mime* through *formatter*.

    ``formatter(obj)`` is called for every displayed object (and rich trailing value) whose
    repr methods did not give *mime*, after them; it returns the value (checked as a repr
    method's: bytes for images, plain JSON for ``application/json`` and ``+json``, else str;
    or a ``(value, metadata)`` pair) or None to add nothing. One that raises or returns the
    wrong type is left out, with the reason in the item's metadata. One formatter per mime
    type: adding another replaces it.
    """
    _FORMATTERS[mime] = formatter


def remove_formatter(mime: str) -> None:
    """Stop giving *mime* through a formatter (none added: nothing happens)."""
    _FORMATTERS.pop(mime, None)


def has_rich_repr(obj: object) -> bool:
    """Whether *obj* has a repr method beyond ``text/plain`` (a class attribute, not a probe)."""
    cls = type(obj)
    if getattr(cls, "_repr_mimebundle_", None) is not None:
        return True
    return any(
        getattr(cls, method, None) is not None
        for _, method in (*_BINARY_REPRS, *_TEXT_REPRS, ("application/json", "_repr_json_"))
    )


def bundle(obj: object) -> tuple[dict[str, object], dict[str, object]]:
    """The mime bundle of *obj* and its metadata; never raises for what a repr does."""
    data: dict[str, object] = {}
    meta: dict[str, object] = {}
    errors: dict[str, str] = {}
    _from_mimebundle(obj, data, meta, errors)
    _from_repr_methods(obj, data, meta, errors)
    _from_formatters(obj, data, meta, errors)
    return _finish(obj, data, meta, errors, {})


def raw_bundle(obj: object) -> tuple[dict[str, object], dict[str, object]]:
    """*obj*, a mime bundle given as it is (``display(obj, raw=True)``), and its metadata.

    Each value is checked for its mime type (a wrong one is left out, and the metadata says
    why); a missing ``text/plain`` is an empty one. Never raises.
    """
    data: dict[str, object] = {}
    errors: dict[str, str] = {}
    if isinstance(obj, dict):
        for mime, value in obj.items():
            if not isinstance(mime, str):
                errors[_plain(mime)[:100]] = "a mime type must be a str"
                continue
            _put(mime, value, data, errors, f"a {type(value).__name__} is not a {mime} value")
    else:
        errors["raw"] = f"a {type(obj).__name__} is not a mime bundle (a dict)"
    if "text/plain" not in data:
        data["text/plain"] = ""
    return data, ({"sunroom": {"errors": errors}} if errors else {})


def _finish(
    obj: object,
    data: dict[str, object],
    meta: dict[str, object],
    errors: dict[str, str],
    own: dict[str, object],
) -> tuple[dict[str, object], dict[str, object]]:
    """The bundle with its ``text/plain``, and its metadata with sunroom's own entries."""
    if "text/plain" not in data:
        data["text/plain"] = _plain(obj)
    if errors:
        own = {"errors": errors, **own}
    if own:
        meta["sunroom"] = own
    return data, meta


def _from_mimebundle(
    obj: object, data: dict[str, object], meta: dict[str, object], errors: dict[str, str]
) -> None:
    """Add what ``_repr_mimebundle_`` gives to *data* and *meta*, and why not to *errors*."""
    method = _method(obj, "_repr_mimebundle_")
    if method is None:
        return
    try:
        got = method(include=None, exclude=None)
        extra: object = {}
        if isinstance(got, tuple) and len(got) == 2:
            got, extra = got
        if not isinstance(got, dict):
            raise TypeError(f"it returned {type(got).__name__}, not a dict")
        for mime, value in got.items():
            wrong = f"a {type(value).__name__} is not a {mime} value"
            _put(str(mime), value, data, errors, wrong)
        if isinstance(extra, dict):
            meta.update({str(k): v for k, v in extra.items() if _jsonable(v)})
    except BaseException as exc:  # noqa: BLE001 - a bad repr is reported, never fatal
        if isinstance(exc, KeyboardInterrupt):
            raise
        errors["_repr_mimebundle_"] = _error(exc)


def _from_repr_methods(
    obj: object, data: dict[str, object], meta: dict[str, object], errors: dict[str, str]
) -> None:
    """Add what each ``_repr_*_`` method gives for a mime type *data* does not hold yet."""
    for mime, name in (*_BINARY_REPRS, *_TEXT_REPRS, ("application/json", "_repr_json_")):
        if mime in data:
            continue
        method = _method(obj, name)
        if method is not None:
            _add(mime, method, f"{name}()", data, meta, errors)


def _from_formatters(
    obj: object, data: dict[str, object], meta: dict[str, object], errors: dict[str, str]
) -> None:
    """Add what each formatter gives for a mime type *data* does not hold yet."""
    for mime, formatter in list(_FORMATTERS.items()):
        if mime not in data:
            _add(mime, partial(formatter, obj), f"the {mime} formatter", data, meta, errors)


def _add(
    mime: str,
    produce: Callable[[], object],
    who: str,
    data: dict[str, object],
    meta: dict[str, object],
    errors: dict[str, str],
) -> None:
    """Add *produce*'s value for *mime* to *data*, or why not to *errors*.

    Of a ``(value, metadata)`` pair the metadata goes to *meta*; None adds nothing.
    """
    try:
        value = produce()
        if isinstance(value, tuple) and len(value) == 2:
            value, extra_meta = value
            if isinstance(extra_meta, dict) and _jsonable(extra_meta):
                meta[mime] = extra_meta
        if value is None:
            return
        _put(mime, value, data, errors, f"{who} returned a {type(value).__name__}")
    except BaseException as exc:  # noqa: BLE001 - a bad repr is reported, never fatal
        if isinstance(exc, KeyboardInterrupt):
            raise
        errors[mime] = _error(exc)


def _put(
    mime: str, value: object, data: dict[str, object], errors: dict[str, str], wrong: str
) -> None:
    """*value* into *data* as *mime*'s if it is one (:func:`_check`), else *wrong* into *errors*."""
    checked = _check(mime, value)
    if checked is None:
        errors[mime] = wrong
    else:
        data[mime] = checked


def _method(obj: object, name: str) -> Callable[..., object] | None:
    try:
        method = getattr(obj, name, None)
    except BaseException:  # noqa: BLE001 - a hostile __getattr__
        return None
    return method if callable(method) else None


def _check(mime: str, value: object) -> object:
    """*value* as it travels for *mime*, or None when it is not a value of that type."""
    if mime in ("image/png", "image/jpeg", "image/gif", "image/webp"):
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            try:
                return binascii.a2b_base64(value.encode("ascii"))
            except (ValueError, binascii.Error):
                return None
        return None
    if mime == "application/json" or mime.endswith("+json"):
        return value if _jsonable(value) else None
    return value if isinstance(value, str) else None


def _jsonable(value: object, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_jsonable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v, depth + 1) for k, v in value.items())
    return False


def _plain(obj: object) -> str:
    try:
        text = repr(obj)
    except BaseException as exc:  # noqa: BLE001 - as the REPL's repr shows it
        if isinstance(exc, KeyboardInterrupt):
            raise
        return f"<repr failed: {type(exc).__name__}>"
    if len(text) > _MAX_REPR:
        return text[: _MAX_REPR // 2] + " ... " + text[-_MAX_REPR // 2 :]
    return text


def _error(exc: BaseException) -> str:
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001
        message = ""
    return f"{type(exc).__name__}: {message}"[:300]


def capture_figures(outputs: Outputs) -> None:
    """Render every open matplotlib figure as a PNG item, then close it (if pyplot is loaded)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        numbers = list(pyplot.get_fignums())
    except Exception:  # noqa: BLE001 - a broken pyplot: nothing to capture
        return
    for number in numbers:
        figure = pyplot.figure(number)
        try:
            outputs.add({"image/png": figure_png(figure), "text/plain": repr(figure)}, {})
        except Exception as exc:  # noqa: BLE001 - e.g. too large to render: said, not fatal
            outputs.add(
                {"text/plain": f"<figure {number} could not be rendered: {_error(exc)}>"},
                {"sunroom": {"errors": {"image/png": _error(exc)}}},
            )
        finally:
            release = getattr(figure.canvas, "release_renderer", None)
            if release is not None:  # the kernel's own canvas (mplbackend)
                release()
            pyplot.close(figure)


class Renderers:
    """Agg renderers of captured figures, kept for the next figure of the same size and dpi.

    At most :attr:`MAX` renderers of at most :attr:`MAX_PIXELS` pixels each (a 640x480 one
    holds 1.2 MB). A renderer taken from the pool belongs to the figure that took it.
    """

    MAX: Final = 2
    MAX_PIXELS: Final = 4_000_000

    def __init__(self) -> None:
        self._free: list[tuple[tuple[float, float, float], object]] = []

    def take(self, key: tuple[float, float, float]) -> object:
        """A free renderer for *key* (width, height, dpi), or None."""
        for i, (k, renderer) in enumerate(self._free):
            if k == key:
                del self._free[i]
                return renderer
        return None

    def give(self, key: tuple[float, float, float], renderer: object) -> None:
        """Keep *renderer* (drawn at *key*) for a later figure, when it is small enough."""
        width, height = key[0], key[1]
        if width * height > self.MAX_PIXELS:
            return
        self._free.append((key, renderer))
        del self._free[: -self.MAX]


RENDERERS = Renderers()


PNG_COMPRESS_LEVEL: Final = 1
"""zlib level of a captured figure's PNG: 2-3x faster than Pillow's default 6 (about 7 against
17 ms for a 640x480 figure), for files 0-30% larger (docs/data.md, "Measured")."""


class _Frame:
    """Where ``savefig(format="rgba")`` writes: keeps Agg's pixel buffer without a copy."""

    def __init__(self) -> None:
        self.parts: list[Sized] = []

    def write(self, data: Sized) -> int:
        self.parts.append(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:  # a file handle to matplotlib
        return 0

    def tell(self) -> int:
        return 0

    def flush(self) -> None:
        pass


def figure_png(figure: Any) -> bytes:  # a matplotlib Figure (matplotlib is not imported here)
    """*figure* as PNG bytes, drawn as ``savefig`` draws it (its dpi, colors, transparency).

    Agg draws into an RGBA buffer; an opaque figure (the usual white one) is stored as RGB and
    compressed at :data:`PNG_COMPRESS_LEVEL`, which makes the encoding 2-3x faster than
    ``savefig(format="png")``. When Pillow or the buffer is not as expected, plain ``savefig``.
    """
    import io

    frame = _Frame()
    figure.savefig(frame, format="rgba")
    pixels: Any = frame.parts[0] if len(frame.parts) == 1 else None  # Agg's buffer
    shape = getattr(pixels, "shape", None)
    buffer = io.BytesIO()
    try:
        from PIL import Image  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:  # matplotlib needs Pillow: not expected
        shape = None
    if shape is None or len(shape) != 3 or shape[2] != 4:
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    height, width = shape[0], shape[1]
    image = Image.frombuffer("RGBA", (width, height), pixels, "raw", "RGBA", 0, 1)
    if image.getchannel("A").getextrema()[0] == 255:  # opaque: the alpha channel says nothing
        image = image.convert("RGB")
    image.save(buffer, format="png", compress_level=PNG_COMPRESS_LEVEL)
    return buffer.getvalue()


def show(*args: object, **kwargs: object) -> None:
    """``plt.show()`` in a kernel: emit the open figures now (the backend's ``show``)."""
    capture_figures(OUTPUTS)


def install() -> None:
    """Make ``display`` a builtin (the kernel calls this once, at start)."""
    builtins.display = display  # type: ignore[attr-defined]
