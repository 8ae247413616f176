"""Request and response bodies of the HTTP API (pydantic), and a session's output schema.

A session's ``output_schema`` is a JSON Schema (draft 2020-12 unless its ``$schema`` names
another); :func:`output_type` checks it against its meta-schema and returns it as the
:class:`~sunroom.agent.schema.JsonSchema` that ``submit`` validates against with ``jsonschema``
on the host: every keyword the client sends is enforced. Only local ``$ref``s are allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, Literal

import pydantic

from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, MAX_REASON_CHARS, MAX_TIMEOUT_S
from sunroom.agent.budget import Budget
from sunroom.agent.schema import JsonSchema
from sunroom.sandbox.limits import MIN_PIDS, Limits
from sunroom.service.config import NetworkSpec

__all__ = [
    "MAX_APPROVAL_RULES",
    "RANGES",
    "Accepted",
    "ApprovalAnswered",
    "ApprovalIn",
    "ApprovalOut",
    "ApprovalsOut",
    "BudgetIn",
    "CellErrorOut",
    "CreateKernel",
    "CreateSession",
    "DisplayOut",
    "Execute",
    "ExecutionOut",
    "FileDeleted",
    "FileInputIn",
    "FileOut",
    "FileWritten",
    "FilesOut",
    "Fork",
    "Forked",
    "HealthOut",
    "ReadyOut",
    "KernelCreated",
    "KernelDeleted",
    "KernelOut",
    "KernelsOut",
    "LimitsIn",
    "MessageIn",
    "NetworkIn",
    "Problem",
    "ProblemOut",
    "ResultOut",
    "SessionCreated",
    "SessionDeleted",
    "SessionOut",
    "SessionsOut",
    "output_type",
]

_Strict = pydantic.ConfigDict(extra="forbid")

_N = pydantic.Strict()
"""On every number of a request: a JSON number only (never a string such as ``"2"`` or a bool),
and a whole number where the field counts something (``2.0`` is refused there)."""

MAX_APPROVAL_RULES: Final = 256
"""Most entries a session's ``approvals`` mapping may have over HTTP."""

_Rule = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=200)]

KernelName = Annotated[
    str, pydantic.StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
]
"""A Jupyter kernelspec's name (the characters jupyter-client allows in one)."""
Sandbox = Literal["bwrap", "docker", "none"]
"""Where a jupyter kernel runs (``sandbox`` of :class:`sunroom.JupyterBackend`)."""

RANGES: Final[dict[str, tuple[float, float, str]]] = {
    # field: (lowest, highest, unit); documented in docs/service.md ("Limits")
    "limits.timeout_s": (0.001, 86_400, "seconds"),
    "limits.memory_mb": (16, 1_048_576, "MiB"),
    "limits.cpu_s": (1, 604_800, "CPU seconds"),
    "limits.pids": (MIN_PIDS, 65_536, "processes"),
    "limits.max_output_bytes": (1, 2 * 1024 * 1024, "bytes"),
    "limits.max_display_bytes": (1, 8 * 1024 * 1024, "bytes"),
    "budget.max_model_calls": (1, 1_000_000, "calls"),
    "budget.max_tokens": (1, 10**10, "tokens"),
    "budget.max_cost_micro_usd": (1, 10**12, "micro-USD"),
    "budget.max_wall_s": (0.001, 2_592_000, "seconds"),
    "budget.max_network_bytes": (1, 10**15, "bytes"),
    "timeout_s": (0.001, 86_400, "seconds"),
}


def _fmt(x: float) -> str:
    return f"{x:,.3f}".rstrip("0").rstrip(".") if isinstance(x, float) else f"{x:,}"


def _in_range(name: str) -> Callable[[float], float]:
    lo, hi, unit = RANGES[name]

    def check(value: float) -> float:
        # NaN fails both comparisons; infinity fails the upper one
        if not (isinstance(value, int) or math.isfinite(value)) or not lo <= value <= hi:
            raise ValueError(f"must be a number from {_fmt(lo)} to {_fmt(hi)} ({unit})")
        return value

    return check


def _whole(name: str) -> Callable[[object], object]:
    check = _in_range(name)

    def before(value: object) -> object:
        if isinstance(value, float):  # 1e30 names the range, not "exceeded maximum size"
            check(value)
        return value

    return before


def _b(name: str) -> pydantic.BeforeValidator:
    return pydantic.BeforeValidator(_whole(name))


def _a(name: str) -> pydantic.AfterValidator:
    return pydantic.AfterValidator(_in_range(name))


_Timeout = Annotated[float, _N, _a("limits.timeout_s")]
_MemoryMb = Annotated[int, _N, _b("limits.memory_mb"), _a("limits.memory_mb")]
_CpuS = Annotated[int, _N, _b("limits.cpu_s"), _a("limits.cpu_s")]
_Pids = Annotated[int, _N, _b("limits.pids"), _a("limits.pids")]
_OutputBytes = Annotated[int, _N, _b("limits.max_output_bytes"), _a("limits.max_output_bytes")]
_DisplayBytes = Annotated[int, _N, _b("limits.max_display_bytes"), _a("limits.max_display_bytes")]
_ModelCalls = Annotated[int, _N, _b("budget.max_model_calls"), _a("budget.max_model_calls")]
_Tokens = Annotated[int, _N, _b("budget.max_tokens"), _a("budget.max_tokens")]
_Cost = Annotated[int, _N, _b("budget.max_cost_micro_usd"), _a("budget.max_cost_micro_usd")]
_WallS = Annotated[float, _N, _a("budget.max_wall_s")]
_NetBytes = Annotated[int, _N, _b("budget.max_network_bytes"), _a("budget.max_network_bytes")]
_CellTimeout = Annotated[float, _N, _a("timeout_s")]


class LimitsIn(pydantic.BaseModel):
    """Kernel limits a client may set (see :class:`sunroom.sandbox.limits.Limits`)."""

    model_config = _Strict

    timeout_s: _Timeout | None = None
    memory_mb: _MemoryMb | None = None
    cpu_s: _CpuS | None = None
    pids: _Pids | None = None
    max_output_bytes: _OutputBytes | None = None
    max_display_bytes: _DisplayBytes | None = None

    def build(self) -> Limits:
        """The Limits (defaults for what is unset). Raises UsageError."""
        return Limits(**self.model_dump(exclude_none=True))


class BudgetIn(pydantic.BaseModel):
    """A session budget (see :class:`sunroom.agent.Budget`)."""

    model_config = _Strict

    max_model_calls: _ModelCalls | None = None
    max_tokens: _Tokens | None = None
    max_cost_micro_usd: _Cost | None = None
    max_wall_s: _WallS | None = None
    max_network_bytes: _NetBytes | None = None

    def build(self) -> Budget:
        """The Budget. Raises UsageError."""
        return Budget(**self.model_dump())


class FileInputIn(pydantic.BaseModel):
    """A host file bound read-only as a variable (``sunroom run --input``; never over HTTP).

    The session's stored config keeps the resolved path, size and modification time, never
    the content: a resumed session binds the same file, and refuses one that changed.
    """

    model_config = _Strict

    path: str = pydantic.Field(min_length=1)
    size: int | None = pydantic.Field(default=None, ge=0)
    mtime_ns: int | None = None


MAX_CLIENT_HOSTS: Final = 10_000
"""Most allowlist entries a request's own network may have (the server's own: no cap)."""

NetworkName = Annotated[
    str,
    pydantic.StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"),
]
"""A network policy this server configured (``sunroom serve --network NAME=FILE``)."""


class NetworkIn(pydantic.BaseModel):
    """A request's own network allowlist (a server with ``--client-network``): hosts only."""

    model_config = _Strict

    allow: list[Annotated[str, pydantic.StringConstraints(min_length=1, max_length=300)]] = (
        pydantic.Field(max_length=MAX_CLIENT_HOSTS)
    )
    max_bytes: Annotated[int, _N] | None = pydantic.Field(default=None, gt=0)


def network_spec(value: str | NetworkIn | None) -> str | NetworkSpec | None:
    """A request's ``network`` as :meth:`ServiceConfig.network` takes it."""
    if isinstance(value, NetworkIn):
        return NetworkSpec(allow=list(value.allow), max_bytes=value.max_bytes)
    return value


MAX_DEPTH = 3
"""The deepest nesting a session over HTTP may ask for (``max_depth``): each nested session
(``predict(recursive=True)``) starts a kernel of its own, at most ``predict_concurrency`` (8)
at once per level, so depth 3 bounds one session at 1 + 8 + 64 kernels."""


class CreateSession(pydantic.BaseModel):
    """``POST /sessions``: a session, and optionally its first task (which starts a run)."""

    model_config = _Strict

    model: str | None = None
    base_url: str | None = None
    preset: Literal["codeact", "rlm", "typed"] = "codeact"
    task: str | None = None
    inputs: dict[str, object] = pydantic.Field(default_factory=dict)
    files: dict[str, FileInputIn] = pydantic.Field(default_factory=dict)
    limits: LimitsIn | None = None
    budget: BudgetIn | None = None
    output_schema: dict[str, object] | None = None
    max_turns: Annotated[int, _N] = pydantic.Field(default=20, gt=0, le=1000)
    max_depth: Annotated[int, _N] = pydantic.Field(default=1, ge=1, le=MAX_DEPTH)
    system_prompt: str | None = None
    backend: str | None = None
    kernel_name: KernelName | None = None
    sandbox: Sandbox | None = None
    code_mode: Literal["tool", "fenced"] = "tool"
    template: str | None = None
    mcp: list[str] = pydantic.Field(default_factory=list, max_length=32)
    approvals: dict[_Rule, Literal["allow", "deny", "ask"]] = pydantic.Field(
        default_factory=dict, max_length=MAX_APPROVAL_RULES
    )
    approval_timeout_s: Annotated[float, _N] = pydantic.Field(
        default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S
    )
    network: NetworkName | NetworkIn | None = None


class ApprovalIn(pydantic.BaseModel):
    """``POST /sessions/{id}/approvals/{call_id}``: the answer to an approval request."""

    model_config = _Strict

    allow: pydantic.StrictBool
    reason: str | None = pydantic.Field(default=None, max_length=MAX_REASON_CHARS)
    lease: pydantic.StrictBool = False


class MessageIn(pydantic.BaseModel):
    """``POST /sessions/{id}/messages``: a user message (starts a run when idle)."""

    model_config = _Strict

    text: str = pydantic.Field(min_length=1)


class CreateKernel(pydantic.BaseModel):
    """``POST /kernels``: a raw kernel.

    ``kernel_name`` (an installed kernelspec) and ``sandbox`` are only for ``backend`` (or the
    server's default backend) ``jupyter``.
    """

    model_config = _Strict

    backend: str | None = None
    kernel_name: KernelName | None = None
    sandbox: Sandbox | None = None
    inputs: dict[str, object] = pydantic.Field(default_factory=dict)
    limits: LimitsIn | None = None
    template: str | None = None
    mcp: list[str] = pydantic.Field(default_factory=list, max_length=32)
    network: NetworkName | NetworkIn | None = None


class Fork(pydantic.BaseModel):
    """``POST /kernels/{id}/fork``: copies of a raw kernel's live state."""

    model_config = _Strict

    n: Annotated[int, _N, pydantic.Field(ge=1, le=64)] = 1


class Execute(pydantic.BaseModel):
    """``POST /kernels/{id}/execute``: one cell."""

    model_config = _Strict

    code: str
    timeout_s: _CellTimeout | None = None


def output_type(schema: Mapping[str, object] | None) -> JsonSchema | None:
    """The checked JSON Schema ``submit`` must satisfy (None for None).

    Raises UsageError (one sentence naming the path in the schema) for an invalid schema.
    """
    if schema is None:
        return None
    return JsonSchema.parse(schema, what="output_schema")


# -- response bodies: what the routes answer (the OpenAPI document and sunroom.client read them)


class _Answer(pydantic.BaseModel):
    """A response body: it admits fields it does not name (a newer server may add some)."""

    model_config = pydantic.ConfigDict(extra="allow")


class Problem(_Answer):
    """The inside of every error answer: the error's class name and one sentence."""

    type: str
    message: str


class ProblemOut(_Answer):
    """Every error answer (4xx and 5xx): ``{"error": {"type", "message"}}``."""

    error: Problem


class HealthOut(_Answer):
    """``GET /healthz`` (no token needed)."""

    ok: bool
    sessions: int
    sessions_idle: int
    sessions_released: int
    kernels: int
    e2b_sandboxes: int


class ReadyOut(_Answer):
    """``GET /readyz`` (no token needed): 200 when ready, 503 with the reason otherwise."""

    ready: bool
    reason: Literal["draining", "store"] | None = None


class SessionCreated(_Answer):
    """``POST /sessions`` → 201."""

    session_id: str


class SessionOut(_Answer):
    """A session's record (``GET /sessions/{id}``, and each of ``GET /sessions``)."""

    session_id: str
    status: Literal["running", "finished", "failed", "cancelled", "interrupted"]
    created_at: float
    updated_at: float
    finished_at: float | None
    config: dict[str, Any]
    result: dict[str, Any] | None
    owner: str | None


class SessionsOut(_Answer):
    """``GET /sessions``: the newest session records."""

    sessions: list[SessionOut]


class Accepted(_Answer):
    """``POST /sessions/{id}/messages`` → 202: the message is recorded."""

    accepted: bool


class ResultOut(_Answer):
    """``GET /sessions/{id}/result``: 200 once the run ended, 202 (``running``) before."""

    session_id: str
    status: Literal["running", "finished", "failed", "cancelled", "interrupted"]
    result: dict[str, Any] | None


class ApprovalOut(_Answer):
    """One approval request waiting for an answer (docs/approvals.md)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    depth: int
    requested_at: float
    expires_at: float


class ApprovalsOut(_Answer):
    """``GET /sessions/{id}/approvals``: the waiting requests, oldest first."""

    session_id: str
    approvals: list[ApprovalOut]


class ApprovalAnswered(_Answer):
    """``POST /sessions/{id}/approvals/{call_id}`` → 200: the answer is durable."""

    session_id: str
    call_id: str
    allow: bool


class SessionDeleted(_Answer):
    """``DELETE /sessions/{id}`` → 200: cancelled and closed."""

    session_id: str
    deleted: bool


class KernelCreated(_Answer):
    """``POST /kernels`` → 201."""

    kernel_id: str


class CellErrorOut(_Answer):
    """The exception a cell raised, as data (:class:`sunroom.CellError`)."""

    type: str
    message: str
    traceback: str


class DisplayOut(_Answer):
    """One rich output, Jupyter's ``display_data`` shape (images as base64)."""

    output_type: Literal["display_data"]
    data: dict[str, Any]
    metadata: dict[str, Any]


class ExecutionOut(_Answer):
    """``POST /kernels/{id}/execute``: :meth:`sunroom.ExecutionResult.to_dict`."""

    status: Literal["ok", "error", "timeout", "died"]
    ok: bool
    stdout: str
    stderr: str
    value: str | None
    error: CellErrorOut | None
    duration_s: float
    truncated_bytes: int
    state_lost: bool
    outputs: list[DisplayOut]
    dropped_outputs: int


class Forked(_Answer):
    """``POST /kernels/{id}/fork`` → 201: the copies, which share the kernel's sandbox."""

    kernel_ids: list[str]
    shares_trust_domain_with: str


class KernelOut(_Answer):
    """``GET /kernels/{id}``, and each of ``GET /kernels``."""

    kernel_id: str
    backend: str
    kernel_name: str | None
    sandbox: str | None
    template: str | None
    network: str | None
    network_bytes: int | None
    created_at: float


class KernelsOut(_Answer):
    """``GET /kernels``: this server's raw kernels, oldest first."""

    kernels: list[KernelOut]


class KernelDeleted(_Answer):
    """``DELETE /kernels/{id}`` → 200: killed."""

    kernel_id: str
    deleted: bool


class FileWritten(_Answer):
    """``PUT .../files/{path}`` → 200."""

    path: str
    size: int


class FileOut(_Answer):
    """One entry of a workdir listing (mtime in Unix seconds)."""

    path: str
    size: int
    mtime: float
    is_dir: bool


class FilesOut(_Answer):
    """``GET .../files?glob=``: at most 10,000 entries."""

    files: list[FileOut]


class FileDeleted(_Answer):
    """``DELETE .../files/{path}`` → 200."""

    path: str
    deleted: bool
