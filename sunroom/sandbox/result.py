"""What running a cell returns: :class:`ExecutionResult`, plus :class:`Variable`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, final, get_args

Status = Literal["ok", "error", "timeout", "died"]


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

    def __post_init__(self) -> None:
        if self.status not in get_args(Status):
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

    @property
    def ok(self) -> bool:
        """True when the cell ran to completion without raising."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``ok`` included)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


@final
@dataclass(frozen=True, slots=True)
class Variable:
    """A user variable in the kernel: its name, type name and a short repr."""

    name: str
    type: str
    repr: str
