"""Approvals: allow, deny or ask a person before a host function runs (docs/approvals.md).

A *policy* is ``"allow"``, ``"deny"``, ``"ask"`` or a callable ``policy(call) -> decision``
(sync or async) that sees an :class:`ApprovalCall` and returns one of those strings or a
:class:`Decision` (with a reason). Which policy applies to a call of function ``name``:

1. the session's ``approvals`` mapping, when it names ``name`` exactly;
2. else the most specific glob of that mapping matching ``name`` (``fnmatch`` syntax; the
   pattern with the most literal characters wins, then the longer pattern, then the one
   listed first). Globs never match the built-in ``predict``, ``predict_many`` and ``submit``:
   those are gated only when the mapping names them exactly;
3. else the function's own policy (``host_function(fn, approval=...)``);
4. else ``"allow"``.

MCP tools are host functions named ``"<server>.<tool>"``: globs match that full name.

``ask`` suspends the call: :class:`~sunroom.agent.events.ApprovalRequested` is published and
the call waits for :meth:`Approvals.answer` (``session.approve``), at most ``timeout_s`` (then
it is denied, "no answer within N s"). The timeout of the cell that made the call does not run
meanwhile (:func:`~sunroom.sandbox.cellclock.cell_clock_paused`). An answer with ``lease=True``
holds for every later call of that function until the run ends (a lease never outlives its
run; the next run asks again). A denial raises :class:`~sunroom.errors.ApprovalDenied` in the
kernel (a ``PermissionError``) with the reason. A policy callable that raises denies the call.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, cast, final

from sunroom.agent import events as ev
from sunroom.agent.calls import Publish, RedactValue
from sunroom.errors import ApprovalDenied, ApprovalNotPending, UsageError
from sunroom.rpc.eager import in_task
from sunroom.sandbox.cellclock import cell_clock_paused
from sunroom.sandbox.functions import APPROVALS, Gate, HostFunction

__all__ = [
    "BUILT_IN",
    "DEFAULT_TIMEOUT_S",
    "MAX_REASON_CHARS",
    "MAX_TIMEOUT_S",
    "Action",
    "ApprovalCall",
    "ApprovalRequest",
    "Approvals",
    "Decision",
    "Policy",
    "policy_for",
]

Action: TypeAlias = Literal["allow", "deny", "ask"]

DEFAULT_TIMEOUT_S: Final = 300.0
"""How long an ``ask`` waits for an answer by default; then the call is denied."""

MAX_TIMEOUT_S: Final = 7 * 24 * 3600.0
"""The longest approval deadline a session may set (a week)."""

MAX_REASON_CHARS: Final = 2000
"""Longest reason an answer may give."""

BUILT_IN: Final = frozenset({"predict", "predict_many", "submit"})
"""Host functions every session has; a glob never gates them (an exact name does)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalCall:
    """What a policy callable sees: the function's name, the validated arguments, the session.

    ``depth`` is 0 for the root session and 1+ for nested sessions (``predict(recursive=True)``).
    """

    name: str
    arguments: Mapping[str, object]
    session_id: str
    depth: int


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """A policy callable's verdict, with the reason shown to the model when it denies."""

    action: Action
    reason: str = ""


Policy: TypeAlias = (
    "Action | Callable[[ApprovalCall], Decision | Action | Awaitable[Decision | Action]]"
)
"""``"allow"``, ``"deny"``, ``"ask"``, or a callable deciding per call (sync or async)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequest:
    """A call waiting for an answer (what ``session.pending_approvals()`` lists)."""

    call_id: str
    name: str
    arguments: dict[str, object]
    session_id: str
    depth: int
    timeout_s: float
    requested_at: float


@dataclass(frozen=True, slots=True)
class _Waiting:
    request: ApprovalRequest
    answer: asyncio.Future[tuple[bool, str, bool, str]]  # allow, reason, lease, by
    publish: Publish


_GLOB_CHARS = re.compile(r"\[[^\]]*\]|[*?]")


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _specificity(pattern: str) -> tuple[int, int]:
    return len(_GLOB_CHARS.sub("", pattern)), len(pattern)


def check_policy(value: object, where: str) -> None:
    """Raise UsageError unless *value* is a policy (``where`` names it in the message)."""
    if isinstance(value, str) and value in APPROVALS:
        return
    if callable(value) and not isinstance(value, str):
        return
    raise UsageError(f"{where}: an approval policy is 'allow', 'deny', 'ask' or a callable")


def policy_for(name: str, mapping: Mapping[str, Policy], registered: Policy | None) -> Policy:
    """The policy that applies to function *name* (the precedence of the module docstring)."""
    exact = mapping.get(name)
    if exact is not None:
        return exact
    if name not in BUILT_IN:
        best: tuple[int, int] | None = None
        chosen: Policy | None = None
        for pattern, policy in mapping.items():
            if _is_glob(pattern) and fnmatch.fnmatchcase(name, pattern):
                rank = _specificity(pattern)
                if best is None or rank > best:
                    best, chosen = rank, policy
        if chosen is not None:
            return chosen
    return registered if registered is not None else "allow"


async def _decide(policy: Policy, call: ApprovalCall) -> Decision:
    """Run *policy* for *call*; a failing or malformed policy denies, saying why."""
    if isinstance(policy, str):
        return Decision(policy)
    try:
        verdict: object = policy(call)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as exc:  # a failing policy must not let the call through
        return Decision("deny", f"the approval policy failed: {type(exc).__name__}: {exc}")
    if isinstance(verdict, Decision) and verdict.action in APPROVALS:
        return verdict
    if isinstance(verdict, str) and verdict in APPROVALS:
        return Decision(cast(Action, verdict))
    got = type(verdict).__name__
    return Decision("deny", f"the approval policy returned {got}, not a decision")


@final
class Approvals:
    """The approval state of one session tree: policies, waiting calls, answers and leases.

    A session, its branches and its nested sessions share one; a :meth:`fork` gets its own.
    *policies* maps names and globs to policies; *timeout_s* is how long an ``ask`` waits.

    Raises UsageError for a malformed mapping or a timeout outside (0, MAX_TIMEOUT_S].
    """

    def __init__(
        self, policies: Mapping[str, Policy] | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        table = dict(policies or {})
        for key, value in table.items():
            if not isinstance(key, str) or not key:
                raise UsageError("approvals: every key must be a non-empty function name or glob")
            check_policy(value, f"approvals[{key!r}]")
        ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
        if not ok or not (0 < timeout_s <= MAX_TIMEOUT_S) or math.isnan(timeout_s):
            raise UsageError(
                f"approval_timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]"
            )
        self.policies: Mapping[str, Policy] = table
        self.timeout_s = float(timeout_s)
        self._waiting: dict[str, _Waiting] = {}
        self._answered: dict[str, bool] = {}
        self._leases: dict[str, tuple[bool, str]] = {}

    def copy(self) -> Approvals:
        """The same policies and timeout, nothing waiting, no leases (for a fork)."""
        return Approvals(self.policies, timeout_s=self.timeout_s)

    # -- the gate --------------------------------------------------------------------------

    def gate(
        self,
        hf: HostFunction,
        *,
        session_id: str,
        depth: int,
        publish: Publish,
        redact: Callable[[str], str],
        redact_value: RedactValue,
    ) -> Gate | None:
        """The gate enforcing the policy of *hf* (None when it is a plain ``"allow"``).

        *publish* publishes (redacted) events; *redact* / *redact_value* clean the texts and
        the arguments that a request lists and a denial carries into the kernel.
        """
        policy = policy_for(hf.name, self.policies, hf.approval)
        if policy == "allow":
            return None
        name = hf.name

        async def gate(arguments: dict[str, object]) -> None:
            call = ApprovalCall(name=name, arguments=arguments, session_id=session_id, depth=depth)
            decision = await _decide(policy, call)
            if decision.action == "allow":
                return
            if decision.action == "deny":
                reason = redact(decision.reason or "denied by the approval policy")
                publish(ev.Vetoed, what=name, reason=reason)
                raise ApprovalDenied(f"{name}() was denied: {reason}")
            allow, reason = await self._ask(call, publish, redact_value(dict(arguments)))
            if not allow:
                raise ApprovalDenied(f"{name}() was not approved: {redact(reason)}")

        return gate

    async def _ask(
        self, call: ApprovalCall, publish: Publish, shown: dict[str, object]
    ) -> tuple[bool, str]:
        """Publish a request and wait for its answer (the cell's clock paused); (allow, why)."""
        call_id = uuid.uuid4().hex[:16]
        lease = self._leases.get(call.name)
        if lease is not None:
            allow, why = lease  # answered already: only the answer is published
            self._record(call_id, call.name, publish, allow, why, lease=False, by="lease")
            return allow, why
        await in_task()  # asyncio.timeout needs a task; the call may be served eagerly
        loop = asyncio.get_running_loop()
        request = ApprovalRequest(
            call_id=call_id,
            name=call.name,
            arguments=shown,
            session_id=call.session_id,
            depth=call.depth,
            timeout_s=self.timeout_s,
            requested_at=time.time(),
        )
        waiting = _Waiting(request, loop.create_future(), publish)
        self._waiting[call_id] = waiting
        self._announce(call_id, call, publish)
        try:
            with cell_clock_paused():
                async with asyncio.timeout(self.timeout_s):
                    await asyncio.shield(waiting.answer)  # a timeout leaves it to be settled
        except TimeoutError:  # (an answer that came at the same moment stands)
            self._settle(call_id, False, f"no answer within {self.timeout_s:g} s", False, "timeout")
        except asyncio.CancelledError:
            self._settle(call_id, False, "the call was cancelled while it waited", False, "closed")
            raise
        finally:
            self._waiting.pop(call_id, None)
        allow, why, _, _ = waiting.answer.result()
        return allow, why

    def _announce(self, call_id: str, call: ApprovalCall, publish: Publish) -> None:
        publish(
            ev.ApprovalRequested,
            call_id=call_id,
            name=call.name,
            arguments=dict(call.arguments),
            timeout_s=self.timeout_s,
            depth=call.depth,
        )

    # -- answers ---------------------------------------------------------------------------

    def pending(self) -> tuple[ApprovalRequest, ...]:
        """The calls waiting for an answer, oldest first."""
        return tuple(w.request for w in self._waiting.values())

    def answer(
        self, call_id: str, *, allow: bool, reason: str | None = None, lease: bool = False
    ) -> None:
        """Answer the waiting call *call_id*; ``lease`` makes the answer hold for the run.

        A lease also answers the other calls of the same function that wait now. Raises
        ApprovalNotPending (unknown or already answered id), UsageError (bad arguments).
        """
        if not isinstance(allow, bool) or not isinstance(lease, bool):
            raise UsageError("allow and lease must be bools")
        if reason is not None and not isinstance(reason, str):
            raise UsageError("reason must be a str")
        if reason is not None and len(reason) > MAX_REASON_CHARS:
            raise UsageError(f"reason must be at most {MAX_REASON_CHARS} characters")
        if not isinstance(call_id, str) or call_id not in self._waiting:
            answered = isinstance(call_id, str) and call_id in self._answered
            what = "was already answered" if answered else "is not one this session asked"
            raise ApprovalNotPending(f"approval request {str(call_id)[:40]!r} {what}",
                                     answered=answered)  # fmt: skip
        why = reason or ("approved" if allow else "denied by a person")
        name = self._waiting[call_id].request.name
        self._settle(call_id, allow, why, lease, "person")
        if lease:
            self._leases[name] = (allow, why)
            for other in [c for c, w in self._waiting.items() if w.request.name == name]:
                self._settle(other, allow, why, False, "lease")

    def new_run(self) -> None:
        """A run starts: the leases of the previous run end."""
        self._leases.clear()

    def deny_all(self, reason: str) -> None:
        """Deny every waiting call (the session is closing)."""
        for call_id in list(self._waiting):
            self._settle(call_id, False, reason, False, "closed")

    def _settle(self, call_id: str, allow: bool, why: str, lease: bool, by: str) -> None:
        waiting = self._waiting.get(call_id)
        if waiting is None or waiting.answer.done() or call_id in self._answered:
            return
        waiting.answer.set_result((allow, why, lease, by))
        self._record(call_id, waiting.request.name, waiting.publish, allow, why, lease, by)

    def _record(
        self,
        call_id: str,
        name: str,
        publish: Publish,
        allow: bool,
        why: str,
        lease: bool,
        by: str,
    ) -> None:
        self._answered[call_id] = allow
        publish(ev.ApprovalAnswered, call_id=call_id, name=name, allow=allow, reason=why,
                lease=lease, by=by)  # fmt: skip
