"""What a session reports while it runs: a closed union of frozen event types, :data:`Event`.

Every event has ``seq`` (1, 2, 3 ... per session, in publication order) and ``ts`` (wall clock,
``time.time()``). Events are either *routine* (text, code, output, usage, progress: a slow
subscriber may lose some, and is told how many) or *control* (a turn ended, a submit was
accepted or rejected, an error, a budget or context notice, the end of a run: never dropped).
Text fields are already redacted: no registered secret appears in any event.

``branch`` is None for a session's own events; an event a branch of a branched run published
(``run(task, branches=k)``) carries the branch's id, ``"<n>.<i>"`` (the session's n-th branched
run, branch i from 0). The branch tree itself is told by :class:`BranchesStarted`, one
:class:`BranchEnded` per branch and :class:`BranchChosen`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias, final

from sunroom.providers import Usage

if TYPE_CHECKING:
    from sunroom.agent.result import RunResult

__all__ = [
    "CONTROL_EVENTS",
    "ApprovalAnswered",
    "ApprovalRequested",
    "AssistantText",
    "BranchChosen",
    "BranchEnded",
    "BranchesStarted",
    "BudgetWarning",
    "CellStarted",
    "CodeSubmitted",
    "ContextCompacted",
    "ContextWarning",
    "Event",
    "ExecutionFinished",
    "HostCallFinished",
    "HostCallStarted",
    "NetworkConnection",
    "OutputChunk",
    "PREVIEW_CHARS",
    "preview",
    "PredictProgress",
    "SessionEnded",
    "SessionError",
    "SubCallEnded",
    "SubmitAccepted",
    "SubmitRejected",
    "Thinking",
    "TurnEnded",
    "UsageUpdated",
    "Vetoed",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Base:
    seq: int
    ts: float
    branch: str | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantText(_Base):
    """Text the root model wrote in a turn."""

    turn: int
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Thinking(_Base):
    """Readable reasoning the root model returned (empty when the vendor hides it)."""

    turn: int
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CodeSubmitted(_Base):
    """The model asked to run a cell; ``via`` says how (the tool, or a fenced block)."""

    turn: int
    code: str
    via: Literal["tool", "fenced"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CellStarted(_Base):
    """A cell began running in the kernel (after its hooks let it through).

    ``cell`` counts the session's cells from 1; ``lines`` is the code's line count. Its
    :class:`OutputChunk` events and then its :class:`ExecutionFinished` follow.
    """

    turn: int
    cell: int
    lines: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OutputChunk(_Base):
    """Output the running cell wrote, as it came (``stream``: ``"stdout"`` or ``"stderr"``).

    Live and bounded (:mod:`sunroom.agent.live`): writes within a short window are coalesced
    into one chunk (the first of a cell is published at once), and at most a per-cell number
    of bytes is streamed. Past it, the cell's last chunk is a marker whose ``dropped_bytes``
    says how many bytes were not streamed (0 on every other chunk). The text is redacted;
    the cell's :class:`ExecutionFinished` still carries its output as the model saw it.
    """

    turn: int
    cell: int
    stream: str
    text: str
    dropped_bytes: int = 0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFinished(_Base):
    """A cell finished. ``output`` is what the model was shown (truncated head and tail).

    ``status`` is the kernel's (``ok``, ``error``, ``timeout``, ``died``) or ``vetoed``;
    ``truncated_chars`` counts characters cut for the model, ``truncated_bytes`` bytes the
    kernel dropped at the source. ``outputs`` are the cell's display items in Jupyter's
    ``display_data`` shape, JSON-ready (images base64, as in ``.ipynb``; see
    :meth:`sunroom.DisplayItem.to_dict`).
    """

    turn: int
    status: str
    output: str
    truncated_chars: int
    truncated_bytes: int
    duration_s: float
    state_lost: bool
    outputs: tuple[dict[str, object], ...] = ()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostCallStarted(_Base):
    """Code in the kernel called a host function (``call_id`` pairs it with its finish).

    ``arguments`` is a preview of the validated arguments as JSON: redacted, then cut to
    :data:`PREVIEW_CHARS` characters (ending in ``…`` when cut).
    """

    call_id: int
    name: str
    arguments: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HostCallFinished(_Base):
    """A host function returned or raised.

    ``cost_micro_usd`` is the model cost it incurred (``predict``), 0 for plain functions and
    None when a price is unknown; ``error`` is the redacted error text, or None; ``result`` a
    preview of what it returned, as JSON (redacted, cut like ``arguments``), or None when it
    raised.
    """

    call_id: int
    name: str
    duration_s: float
    cost_micro_usd: int | None
    error: str | None
    result: str | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConnection(_Base):
    """The kernel's egress proxy ended (or refused) a connection (a session with ``network=``).

    ``scheme`` is ``"https"`` (a CONNECT tunnel) or ``"http"`` (a forwarded request);
    ``reason`` says why it was refused or cut short (None: allowed and ended normally);
    ``bytes_sent`` went from the kernel out, ``bytes_received`` came back in. No header or
    body is ever in an event.
    """

    host: str
    port: int
    scheme: str
    allowed: bool
    reason: str | None
    bytes_sent: int
    bytes_received: int
    duration_s: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PredictProgress(_Base):
    """``predict_many`` progress: ``done`` of ``total`` items finished, ``failed`` failed."""

    call_id: int
    done: int
    total: int
    failed: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SubCallEnded(_Base):
    """One sub-model call of ``predict``/``predict_many`` ended: a node of the recursion tree.

    ``node`` names it within the session (``"<call_id>.<index>"``: the host call that made it
    and the item's position, 0 for ``predict``). ``parent`` is None for a call made by the
    session's own kernel; for a call made inside a nested session (``recursive=True``) it is
    the node that runs that session, so the log holds the whole tree, however deep; ``depth``
    is 1 for the session's own sub-calls. ``input_tokens``, ``output_tokens`` and
    ``cost_micro_usd`` (None: a price is unknown) are the node's own model calls: for a
    recursive node, its nested session's root-model turns, not its children's (sum them up the
    tree). ``input`` and ``output`` are previews (redacted, cut to :data:`PREVIEW_CHARS`
    characters); ``output`` is empty when ``error`` (redacted) says why it failed. It started
    ``duration_s`` before ``ts``. A nested session publishes these to its root session's
    events.
    """

    node: str
    parent: str | None
    call_id: int
    index: int
    name: str
    depth: int
    recursive: bool
    model: str
    duration_s: float
    input_tokens: int
    output_tokens: int
    cost_micro_usd: int | None
    error: str | None
    input: str
    output: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitAccepted(_Base):
    """``submit`` accepted a value; the run ends with it when the current cell finishes."""

    output: object


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRejected(_Base):
    """``submit`` refused a value; ``reason`` is the per-field diff the kernel saw."""

    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Vetoed(_Base):
    """A hook vetoed a code execution (``what="execute"``) or a host call (its name)."""

    what: str
    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested(_Base):
    """A host call waits for a person's answer (``session.approve(call_id, ...)``).

    ``arguments`` are the validated arguments (redacted); ``timeout_s`` is how long the call
    waits before it is denied; ``depth`` is the nesting of the session that made the call
    (0: the root session).
    """

    call_id: str
    name: str
    arguments: dict[str, object]
    timeout_s: float
    depth: int = 0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalAnswered(_Base):
    """An approval request was answered: ``allow``, why (``reason``), and by whom.

    ``by`` is ``"person"`` (:meth:`approve`), ``"lease"`` (an earlier answer allowed the
    function for the rest of the run), ``"timeout"`` (no answer in time: denied) or
    ``"closed"`` (the session closed or the service stopped while it waited: denied).
    ``lease``: the answer allows the function for the rest of the run.
    """

    call_id: str
    name: str
    allow: bool
    reason: str
    lease: bool = False
    by: Literal["person", "lease", "timeout", "closed"] = "person"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class UsageUpdated(_Base):
    """A model call finished; totals of the session so far (sub-calls included)."""

    usage: Usage
    model_calls: int
    cost_micro_usd: int | None
    sub_call: bool


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetWarning(_Base):
    """A budget limit was hit (``limit``); the run ends with ``budget_exceeded``/``timeout``."""

    limit: str
    message: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextWarning(_Base):
    """The next request is past the context policy's warning watermark."""

    tokens: int
    context_window: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCompacted(_Base):
    """The transcript was compacted: ``removed`` messages replaced by a summary."""

    tokens_before: int
    tokens_after: int
    removed: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionError(_Base):
    """Something failed that the run reports (a model error, a kernel that would not start)."""

    message: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnded(_Base):
    """One model turn (a reply and the cells it asked for) is over."""

    turn: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEnded(_Base):
    """A run reached its terminal result (a session may run again after :meth:`send`)."""

    result: RunResult


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BranchesStarted(_Base):
    """A branched run forked the session into ``branches`` (their ids).

    ``choose`` says how the answer is picked: ``"first"``, ``"vote"`` or the chooser's name.
    """

    branches: tuple[str, ...]
    choose: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BranchEnded(_Base):
    """A branch's run reached its terminal result; its ``branch`` field names it.

    A losing branch closed early ends ``cancelled``. A branch's run ends with this event,
    never with :class:`SessionEnded` (the branched run's own end).
    """

    result: RunResult


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class BranchChosen(_Base):
    """A branched run picked branch ``chosen`` (None: no branch), for ``reason``."""

    chosen: str | None
    reason: str


Event: TypeAlias = (
    AssistantText
    | Thinking
    | CodeSubmitted
    | CellStarted
    | OutputChunk
    | ExecutionFinished
    | HostCallStarted
    | HostCallFinished
    | NetworkConnection
    | PredictProgress
    | SubCallEnded
    | SubmitAccepted
    | SubmitRejected
    | Vetoed
    | ApprovalRequested
    | ApprovalAnswered
    | UsageUpdated
    | BudgetWarning
    | ContextWarning
    | ContextCompacted
    | SessionError
    | TurnEnded
    | SessionEnded
    | BranchesStarted
    | BranchEnded
    | BranchChosen
)
"""Every event a session publishes (a closed union)."""

PREVIEW_CHARS = 2000
"""The most characters of a preview in an event (host-call arguments and results, sub-call
input and output); a cut preview ends in ``…``."""


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """*text* cut to *limit* characters, the last one ``…`` when it was cut.

    Redact before cutting: a secret cut in half would no longer be recognised.
    """
    return text if len(text) <= limit else text[: limit - 1] + "…"


CONTROL_EVENTS: tuple[type[Event], ...] = (
    TurnEnded,
    SubmitAccepted,
    SubmitRejected,
    Vetoed,
    ApprovalRequested,
    ApprovalAnswered,
    SessionError,
    BudgetWarning,
    ContextWarning,
    ContextCompacted,
    SessionEnded,
    BranchesStarted,
    BranchEnded,
    BranchChosen,
)
"""Event types a subscriber never loses, however slow it is."""
