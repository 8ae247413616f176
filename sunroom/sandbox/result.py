"""What running a cell returns: :class:`ExecutionResult`, plus :class:`Variable`."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, final, get_args

Status = Literal["ok", "error", "timeout", "died"]
_STATUSES = frozenset(get_args(Status))


@final
@dataclass(frozen=True, slots=True)
class CellError:
    """An error raised by a cell (or its death), as data.

    ``traceback`` is trimmed to the user's own frames and shows the failing line.
    """

    type: str
    message: str
    traceback: str

    def __post_init__(self) -> None:
        for name in ("type", "message", "traceback"):
            if type(getattr(self, name)) is not str:
                raise TypeError(f"CellError.{name} must be a str")


@final
@dataclass(frozen=True, slots=True)
class DisplayItem:
    """One rich output of a cell (``display(obj)``, a figure, a rich trailing value).

    ``data`` maps mime types to values: ``bytes`` for images (``image/png``, ``image/jpeg``,
    ``image/gif``, ``image/webp``), plain JSON for ``application/json``, ``str`` otherwise;
    ``text/plain`` is always there. ``metadata`` is plain JSON (``metadata["sunroom"]
    ["errors"]`` names the repr methods that failed, and why; ``metadata["sunroom"]
    ["execute_result"]`` is True on the item of the cell's rich trailing value).
    """

    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.data, Mapping) or "text/plain" not in self.data:
            raise TypeError("DisplayItem.data must be a mapping with text/plain")

    @property
    def images(self) -> dict[str, bytes]:
        """The image mime types of this item and their bytes."""
        return {m: v for m, v in self.data.items() if isinstance(v, bytes)}

    def to_dict(self) -> dict[str, Any]:
        """Jupyter's ``display_data`` shape, JSON-ready: images as base64, as in ``.ipynb``."""
        data = {
            mime: base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
            for mime, value in self.data.items()
        }
        return {"output_type": "display_data", "data": data, "metadata": dict(self.metadata)}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionResult:
    """The outcome of one ``execute``.

    Attributes:
        status: ``"ok"``, ``"error"`` (the cell raised), ``"timeout"`` (the limit fired) or
            ``"died"`` (the kernel process died: crash, ``os._exit``, out of memory).
        stdout / stderr: captured output (fd-level), head and tail kept within the cap.
        value: ``repr`` of the trailing expression, as a REPL shows it, or None.
        error: the exception as data when status is not ``"ok"``.
        duration_s: wall time of the call as the host saw it.
        truncated_bytes: output bytes dropped by the cap (both streams).
        state_lost: the kernel was restarted because of this cell; its variables are gone
            (inputs and host functions were bound again).
        outputs: rich outputs in order (:class:`DisplayItem`): ``display()`` calls, matplotlib
            figures open at the end of the cell, a trailing value with rich reprs.
        dropped_outputs: display items dropped by the caps (``Limits.max_display_bytes`` per
            cell, 100 items).

    Every field holds exactly the type above (checked when the result is built: a TypeError
    is a bug of the code building it), so :meth:`to_dict` is always JSON-serialisable.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    error: CellError | None = None
    duration_s: float = 0.0
    truncated_bytes: int = 0
    state_lost: bool = False
    outputs: tuple[DisplayItem, ...] = ()
    dropped_outputs: int = 0

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise TypeError(f"ExecutionResult.status must be one of {get_args(Status)}")
        for name in ("stdout", "stderr"):
            if type(getattr(self, name)) is not str:
                raise TypeError(f"ExecutionResult.{name} must be a str")
        if self.value is not None and type(self.value) is not str:
            raise TypeError("ExecutionResult.value must be a str or None")
        if self.error is not None and type(self.error) is not CellError:
            raise TypeError("ExecutionResult.error must be an CellError or None")
        if type(self.duration_s) not in (int, float) or not math.isfinite(self.duration_s):
            raise TypeError("ExecutionResult.duration_s must be a finite number")
        if type(self.truncated_bytes) is not int or self.truncated_bytes < 0:
            raise TypeError("ExecutionResult.truncated_bytes must be an int >= 0")
        if type(self.state_lost) is not bool:
            raise TypeError("ExecutionResult.state_lost must be a bool")
        if type(self.outputs) is not tuple or not all(
            type(item) is DisplayItem for item in self.outputs
        ):
            raise TypeError("ExecutionResult.outputs must be a tuple of DisplayItem")
        if type(self.dropped_outputs) is not int or self.dropped_outputs < 0:
            raise TypeError("ExecutionResult.dropped_outputs must be an int >= 0")

    @property
    def ok(self) -> bool:
        """True when the cell ran to completion without raising."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``ok`` included)."""
        out = asdict(self)
        out["outputs"] = [item.to_dict() for item in self.outputs]
        out["ok"] = self.ok
        return out


@final
@dataclass(frozen=True, slots=True)
class Variable:
    """A user variable in the kernel: its name, type name and a short repr."""

    name: str
    type: str
    repr: str
