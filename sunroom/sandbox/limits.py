"""Resource limits for one kernel: every limit has a number and a default."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from sunroom.errors import UsageError
from sunroom.rpc.codec import DEFAULT_MAX_FRAME

MIN_PIDS = 32
"""The fewest processes and threads ``Limits.pids`` may allow. Measured needs to start and run a
cell: 3 on subprocess and docker, 4 on bwrap, 16 for a Jupyter kernel (ipykernel's threads);
the floor leaves a kernel room for a few threads of its own."""

CELL_REQUEST_ROOM = 512
"""Bytes of an ``execute`` request frame besides the cell's source (its id, method, caps)."""


@final
@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Limits applied to a kernel.

    Attributes:
        timeout_s: wall-clock limit of one ``execute`` (the default; a call may override it).
        interrupt_grace_s: after a timeout, how long SIGINT may take before the tree is killed.
        memory_mb: memory cap. Enforced by a cgroup where one is writable (resident memory), and
            always as ``RLIMIT_AS`` (address space) at ``memory_mb + address_space_slack_mb``.
        address_space_slack_mb: address space allowed beyond ``memory_mb`` for thread stacks and
            allocator arenas, which reserve far more than they use.
        pids: most processes/threads the kernel's cgroup may hold (where a pids cgroup exists);
            at least :data:`MIN_PIDS`.
        cpu_s: total CPU seconds of the kernel's lifetime (``RLIMIT_CPU``); None for no limit.
        cpu_quota: CPU cores the kernel may use at once (cgroup CPU quota); None for no limit.
        max_output_bytes: output kept per stream per cell (head + tail); the rest is dropped
            and counted in ``ExecutionResult.truncated_bytes``.
        max_display_bytes: rich outputs kept per cell (images, HTML ...: ``display()``,
            figures); items past it are dropped and counted in
            ``ExecutionResult.dropped_outputs``. None (the default): 8 MiB, or half of
            ``max_frame_bytes`` when that is smaller. At most half of ``max_frame_bytes``: a
            cell's result travels in one frame. :attr:`display_bytes` is the figure in force.
        file_size_mb: largest file the kernel may write (``RLIMIT_FSIZE``).
        open_files: most open file descriptors (``RLIMIT_NOFILE``).
        disk_mb: size cap of the workdir where the backend can enforce one (tmpfs).
        start_timeout_s: how long a kernel may take to start and say hello.
        max_frame_bytes: largest protocol frame either side accepts.
    """

    timeout_s: float = 30.0
    interrupt_grace_s: float = 1.0
    memory_mb: int = 2048
    address_space_slack_mb: int = 2048
    pids: int = 256
    cpu_s: int | None = None
    cpu_quota: float | None = None
    max_output_bytes: int = 1_000_000
    max_display_bytes: int | None = None
    file_size_mb: int = 1024
    open_files: int = 1024
    disk_mb: int = 1024
    start_timeout_s: float = 30.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "interrupt_grace_s",
            "memory_mb",
            "pids",
            "max_output_bytes",
            "file_size_mb",
            "open_files",
            "disk_mb",
            "start_timeout_s",
            "max_frame_bytes",
        ):
            value = getattr(self, name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise UsageError(f"Limits.{name} must be a positive finite number, got {value!r}")
        for name in ("cpu_s", "cpu_quota"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int | float) or not math.isfinite(value) or value <= 0
            ):
                raise UsageError(
                    f"Limits.{name} must be positive and finite or None, got {value!r}"
                )
        if self.pids < MIN_PIDS:
            raise UsageError(
                f"Limits.pids must be at least {MIN_PIDS}: a kernel needs a few processes and "
                f"threads of its own to start, got {self.pids!r}"
            )
        if self.address_space_slack_mb < 0:
            raise UsageError("Limits.address_space_slack_mb must be >= 0")
        if self.max_frame_bytes < 1024:
            raise UsageError("Limits.max_frame_bytes must be at least 1024")
        display = self.max_display_bytes
        if display is not None and (
            not isinstance(display, int) or isinstance(display, bool) or display <= 0
        ):
            raise UsageError(f"Limits.max_display_bytes must be a positive int, got {display!r}")
        if display is not None and display > self.max_frame_bytes // 2:
            raise UsageError(
                f"Limits.max_display_bytes ({self.max_display_bytes}) must be at most half of "
                f"max_frame_bytes ({self.max_frame_bytes}): a cell's result is one frame"
            )

    @property
    def display_bytes(self) -> int:
        """The byte cap over one cell's display items in force (see ``max_display_bytes``)."""
        if self.max_display_bytes is not None:
            return self.max_display_bytes
        return min(8 << 20, self.max_frame_bytes // 2)

    @property
    def max_code_bytes(self) -> int:
        """The longest cell source ``execute`` sends, in UTF-8 bytes: the request is one frame."""
        return self.max_frame_bytes - CELL_REQUEST_ROOM

    def check_code(self, code: str, *, what: str = "the code") -> None:
        """Raise UsageError (naming *what* and the limit) when *code* is over max_code_bytes.

        A cell over it could not be sent: the channel refuses a frame over ``max_frame_bytes``.
        """
        limit = self.max_code_bytes
        if len(code) * 4 <= limit:  # 4 bytes per character at most in UTF-8: no need to encode
            return
        if len(code) > limit or len(code.encode("utf-8", "surrogatepass")) > limit:
            raise UsageError(
                f"{what} is over {limit:,} bytes, the most one cell's source may be (a cell "
                f"is sent in one protocol frame of at most {self.max_frame_bytes:,} bytes)"
            )

    def rlimits(self) -> dict[str, int]:
        """The rlimits the kernel process sets on itself, in bytes/seconds/count."""
        mb = 1024 * 1024
        out = {
            "as": (self.memory_mb + self.address_space_slack_mb) * mb,
            "fsize": self.file_size_mb * mb,
            "nofile": self.open_files,
            "core": 0,
        }
        if self.cpu_s is not None:
            out["cpu"] = int(self.cpu_s)
        return out
