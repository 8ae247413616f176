"""What running a cell returns: :class:`ExecutionResult`, plus :class:`Variable`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, final

Status = Literal["ok", "error", "timeout", "died"]


@final
@dataclass(frozen=True, slots=True)
class ExecutionError:
    """An error raised by a cell (or its death), as data.

    ``traceback`` is trimmed to the user's own frames and shows the failing line.
    """

    type: str
    message: str
    traceback: str


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
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    error: ExecutionError | None = None
    duration_s: float = 0.0
    truncated_bytes: int = 0
    state_lost: bool = False

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
