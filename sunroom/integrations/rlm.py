"""The rlm framework's REPL environment on a sunroom kernel: ``RLM(environment="sunroom")``.

`rlm <https://github.com/alexzhang13/rlm>`_ (the RLM reference implementation, PyPI ``rlms``)
runs the model's code in an *environment* (``rlm.environments.BaseEnv``). :class:`SunroomEnv`
is one: each instance is one persistent sunroom kernel (bwrap by default), and the names rlm's
system prompt promises are there in it:

* ``llm_query`` / ``llm_query_batched`` / ``rlm_query`` / ``rlm_query_batched`` are sunroom
  **host functions**: a call from the kernel runs on the host, which sends it to the RLM's own
  LM handler (the ``lm_handler_address`` rlm gives every environment) or its sub-call callback.
  No broker in the sandbox, no polling, no network for the kernel: the model's keys and clients
  stay on the host. Failures come back as ``"Error: ..."`` strings, as in rlm's environments.
* ``context`` (``context_0``, ``context_1`` ...) is **bound** (``Kernel.bind``), streamed in
  1 MiB chunks when large, never pasted into code or written to a shared directory.
* ``answer`` (``answer["ready"] = True`` ends the run), ``SHOW_VARS()`` and the aliases are the
  kernel-side scaffold of :mod:`sunroom.prelude.rlm`, restored after every cell.
* Custom tools: a callable becomes a host function (it runs on the host; upstream's isolated
  environments drop host callables), a string of code (``def``/``class``/``lambda`` or several
  lines) is run in the kernel, any other value is bound as data.

rlm chooses environments from a list fixed in its source (``rlm.environments.get_environment``).
:func:`register` adds ``"sunroom"`` to it by wrapping that one public function; see its
docstring for exactly what it replaces. rlm itself hands ``subcall_fn`` (recursive
``rlm_query``) and ``compaction`` only to environments it names (``local``, ``ipython``,
``docker``) and allows ``persistent=True`` only for those, so under ``RLM(environment=
"sunroom")`` ``rlm_query`` is a plain ``llm_query`` and compaction needs
``environment_kwargs={"compaction": True}``; constructed directly, ``SunroomEnv`` takes all of
them (and implements rlm's persistence protocol).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from sunroom.errors import KernelError, UsageError
from sunroom.extras import require

require("rlm", "sunroom.integrations.rlm")

from rlm.core.comms_utils import (  # noqa: E402 - after the extra's check
    LMRequest,
    send_lm_request,
    send_lm_request_batched,
)
from rlm.core.types import REPLResult, RLMChatCompletion  # noqa: E402
from rlm.environments.base_env import (  # noqa: E402
    NonIsolatedEnv,
    parse_custom_tools,
    validate_custom_tools,
)

from sunroom.network.policy import Network  # noqa: E402
from sunroom.sandbox.functions import HostFunction, host_function  # noqa: E402
from sunroom.sandbox.limits import Limits  # noqa: E402
from sunroom.sandbox.packages import Packages  # noqa: E402
from sunroom.sandbox.result import ExecutionResult  # noqa: E402
from sunroom.sandbox.sync import Kernel  # noqa: E402

__all__ = ["DEFAULT_LIMITS", "SunroomEnv", "register", "registered", "unregister"]

log = logging.getLogger(__name__)

ENVIRONMENT: Final = "sunroom"
"""The name :func:`register` gives the environment: ``RLM(environment="sunroom")``."""

DEFAULT_LIMITS: Final = Limits(timeout_s=600.0)
"""The kernel's limits unless ``limits=`` says otherwise: sunroom's defaults, except that a cell
may run 10 minutes (its ``llm_query`` calls run within the cell's time; rlm's own environments
have no cell timeout at all)."""

Prompt = str | list[dict[str, Any]] | dict[str, Any]
"""What rlm's clients take as a prompt: text or chat messages."""

SubcallFn = Callable[[str, str | None], RLMChatCompletion]

_SCAFFOLD: Final = "import sunroom.prelude.rlm as _sunroom_rlm\n"
_AFTER_CELL: Final = _SCAFFOLD + "_sunroom_rlm.after_cell(globals())"
_INSTALL: Final = _SCAFFOLD + "_sunroom_rlm.install(globals(), {bound!r})"
_REFRESH: Final = _SCAFFOLD + "_sunroom_rlm.refresh(globals(), {bound!r})"
_RESET_ANSWER: Final = _SCAFFOLD + "_sunroom_rlm.reset_answer(globals())"
_REMEMBER_HISTORY: Final = _SCAFFOLD + "_sunroom_rlm.remember_history(globals())"


def _is_code(value: object) -> bool:
    """The rule of rlm's isolated environments: a string that defines something is code."""
    if not isinstance(value, str):
        return False
    head = value.strip()
    return head.startswith(("def ", "class ", "lambda")) or "\n" in value


class SunroomEnv(NonIsolatedEnv):  # type: ignore[misc]  # rlm ships no type information
    """An rlm environment whose REPL is one persistent sunroom kernel.

    The first arguments are those rlm passes every environment (``RLM`` fills them); sunroom's
    own options follow by keyword: *backend* (``"bwrap"``, ``"docker"``, ``"subprocess"`` ...),
    *limits* (default :data:`DEFAULT_LIMITS`), *env* (the kernel's environment variables),
    *network* (None: no network) and *packages*.

    ``execute_code`` returns rlm's ``REPLResult``: the cell's stdout; its stderr followed by the
    trimmed traceback when it raised (a timeout or a death too, with a line saying the state was
    lost when the kernel had to be restarted); ``locals`` as a short ``repr`` per user variable;
    ``rlm_calls`` the completions its ``llm_query``/``rlm_query`` calls made, in call order per
    call site; ``final_answer`` the ``answer["content"]`` set ready during the cell.

    Raises UsageError for an unknown option or a custom tool that cannot be served (a reserved
    name: ValueError, as rlm's environments), and KernelStartError / SandboxUnavailableError
    when the kernel cannot start. :meth:`cleanup` (or leaving ``with``) kills the kernel's whole
    process tree; it is idempotent.
    """

    def __init__(
        self,
        lm_handler_address: tuple[str, int] | None = None,
        context_payload: dict[str, Any] | list[Any] | str | None = None,
        setup_code: str | None = None,
        persistent: bool = False,
        depth: int = 1,
        subcall_fn: SubcallFn | None = None,
        custom_tools: dict[str, Any] | None = None,
        custom_sub_tools: dict[str, Any] | None = None,
        compaction: bool = False,
        max_concurrent_subcalls: int = 4,
        *,
        backend: str = "bwrap",
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        network: Network | None = None,
        packages: Packages | None = None,
        **unknown: object,
    ) -> None:
        if unknown:
            raise UsageError(f"SunroomEnv got unknown options: {', '.join(sorted(unknown))}")
        if max_concurrent_subcalls < 1:
            raise UsageError("max_concurrent_subcalls must be at least 1")
        super().__init__(
            persistent=persistent, depth=depth, max_concurrent_subcalls=max_concurrent_subcalls
        )
        self.lm_handler_address = lm_handler_address
        self.subcall_fn = subcall_fn
        self.compaction = compaction
        self.custom_tools: dict[str, Any] = custom_tools or {}
        self.custom_sub_tools = (
            custom_sub_tools if custom_sub_tools is not None else self.custom_tools
        )
        validate_custom_tools(self.custom_tools)
        self._options: dict[str, Any] = {
            "backend": backend,
            "limits": limits or DEFAULT_LIMITS,
            "env": env,
            "network": network,
            "packages": packages,
        }
        self._kernel: Kernel | None = None
        self._cleaned_up = False
        self._code_tools: list[str] = []  # custom tools given as source, run at every start
        self._calls: list[RLMChatCompletion] = []
        self._calls_lock = threading.Lock()
        self._bound: list[str] = []  # names bound by the host, in order (contexts, histories)
        self._context_count = 0
        self._history_count = 0
        self._compaction_history: list[Any] = []
        self.setup()
        try:
            if compaction:
                self._bind_history()
            if context_payload is not None:
                self.load_context(context_payload)
            if setup_code:
                self.execute_code(setup_code)
        except BaseException:
            self.cleanup()
            raise

    # -- the BaseEnv contract ---------------------------------------------------------------

    def setup(self) -> None:
        """Start the kernel with the helpers as host functions, then install the scaffold.

        The constructor calls it; calling it again while the kernel lives does nothing, and
        after :meth:`cleanup` raises KernelError.
        """
        if self._kernel is not None:
            return
        if self._cleaned_up:
            raise KernelError("this SunroomEnv was cleaned up; build a new one")
        functions: list[HostFunction] = [
            host_function(self._llm_query, name="llm_query"),
            host_function(self._llm_query_batched, name="llm_query_batched"),
            host_function(self._rlm_query, name="rlm_query"),
            host_function(self._rlm_query_batched, name="rlm_query_batched"),
        ]
        data: dict[str, Any] = {}
        self._code_tools.clear()
        for tool in parse_custom_tools(self.custom_tools):
            if tool.is_callable:
                try:
                    functions.append(
                        host_function(tool.value, name=tool.name, description=tool.description)
                    )
                except UsageError as exc:
                    raise UsageError(f"custom tool {tool.name!r} cannot be served: {exc}") from exc
            elif _is_code(tool.value):
                self._code_tools.append(tool.value)
            else:
                data[tool.name] = tool.value
        kernel = Kernel(functions=functions, **self._options)
        self._kernel = kernel
        try:
            kernel.start()
            if data:
                kernel.bind(**data)
                self._bound.extend(data)
            self._install()
        except BaseException:
            self.cleanup()
            raise

    def load_context(self, context_payload: dict[str, Any] | list[Any] | str) -> None:
        """Bind *context_payload* as ``context_0``, aliased ``context``."""
        self.add_context(context_payload, 0)

    def execute_code(self, code: str) -> REPLResult:
        """Run *code* as one cell; see the class docstring for the result."""
        start = time.perf_counter()
        kernel = self._live()
        with self._calls_lock:
            self._calls.clear()
        result = kernel.execute(code)
        stderr = result.stderr + _error_text(result)
        if result.state_lost:
            stderr += "\n(the kernel was restarted: variables defined by earlier cells are gone)"
            self._install()
        final_answer, shown = self._after_cell()
        with self._calls_lock:
            calls = list(self._calls)
            self._calls.clear()
        return REPLResult(
            stdout=result.stdout,
            stderr=stderr,
            locals=shown,
            execution_time=time.perf_counter() - start,
            rlm_calls=calls,
            final_answer=final_answer,
        )

    def cleanup(self) -> None:
        """Kill the kernel's process tree and wait for it (idempotent)."""
        kernel, self._kernel = self._kernel, None
        self._cleaned_up = True
        if kernel is not None:
            kernel.close()

    def __enter__(self) -> SunroomEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    @property
    def kernel(self) -> Kernel:
        """The sunroom kernel (raises KernelError after :meth:`cleanup`)."""
        return self._live()

    # -- rlm's persistence protocol (SupportsPersistence) ------------------------------------

    def update_handler_address(self, address: tuple[str, int]) -> None:
        """Serve later ``llm_query`` calls from the LM handler at *address*; a fresh ``answer``."""
        self.lm_handler_address = address
        self._run(_RESET_ANSWER, "resetting answer")

    def add_context(
        self, context_payload: dict[str, Any] | list[Any] | str, context_index: int | None = None
    ) -> int:
        """Bind *context_payload* as ``context_N`` (N auto-increments unless given); returns N."""
        index = self._context_count if context_index is None else context_index
        self._bind(f"context_{index}", context_payload)
        self._context_count = max(self._context_count, index + 1)
        return index

    def get_context_count(self) -> int:
        """How many contexts were added."""
        return self._context_count

    def add_history(
        self, message_history: list[dict[str, Any]], history_index: int | None = None
    ) -> int:
        """Bind a copy of *message_history* as ``history_N`` (``history`` aliases N=0)."""
        index = self._history_count if history_index is None else history_index
        self._bind(f"history_{index}", copy.deepcopy(message_history))
        self._history_count = max(self._history_count, index + 1)
        return index

    def get_history_count(self) -> int:
        """How many histories were added."""
        return self._history_count

    def append_compaction_entry(self, entry: list[dict[str, Any]] | dict[str, Any]) -> None:
        """Add a trajectory segment or summary to ``history`` (only with ``compaction=True``)."""
        if not self.compaction:
            return
        self._compaction_history.append(copy.deepcopy(entry))
        self._bind_history()

    # -- the host functions ----------------------------------------------------------------

    def _track(self, completion: RLMChatCompletion) -> None:
        with self._calls_lock:
            self._calls.append(completion)

    def _llm_query(self, prompt: Prompt, model: str | None = None) -> str:
        """Ask the language model once (no REPL, no recursion); returns its reply text.

        Failures come back as a string starting with "Error:".
        """
        address = self.lm_handler_address
        if address is None:
            return "Error: No LM handler configured"
        response = send_lm_request(address, LMRequest(prompt=prompt, model=model, depth=self.depth))
        if not response.success:
            return f"Error: {response.error}"
        self._track(response.chat_completion)
        return str(response.chat_completion.response)

    def _llm_query_batched(self, prompts: list[Prompt], model: str | None = None) -> list[str]:
        """Ask the language model each prompt concurrently; replies in prompt order.

        A failed prompt's slot holds a string starting with "Error:".
        """
        address = self.lm_handler_address
        if address is None:
            return ["Error: No LM handler configured"] * len(prompts)
        replies: list[str] = []
        for response in send_lm_request_batched(address, prompts, model=model, depth=self.depth):
            if response.success:
                self._track(response.chat_completion)
                replies.append(str(response.chat_completion.response))
            else:
                replies.append(f"Error: {response.error}")
        return replies

    @staticmethod
    def _subcall(
        fn: SubcallFn, prompt: str, model: str | None
    ) -> tuple[str, RLMChatCompletion | None]:
        try:
            completion = fn(prompt, model)
            return str(completion.response), completion
        except Exception as exc:  # the child run's failure is the model's data, as upstream
            log.debug("rlm_query sub-call failed", exc_info=True)
            return f"Error: RLM query failed - {exc}", None

    def _rlm_query(self, prompt: str, model: str | None = None) -> str:
        """Run a child RLM on *prompt* (a plain llm_query when recursion is not configured).

        Failures come back as a string starting with "Error:".
        """
        fn = self.subcall_fn
        if fn is None:
            return self._llm_query(prompt, model)
        reply, completion = self._subcall(fn, prompt, model)
        if completion is not None:
            self._track(completion)
        return reply

    def _rlm_query_batched(self, prompts: list[str], model: str | None = None) -> list[str]:
        """Child RLMs on each prompt, ``max_concurrent_subcalls`` at a time; replies in order.

        A failed prompt's slot holds a string starting with "Error:".
        """
        fn = self.subcall_fn
        if fn is None:
            return self._llm_query_batched(list(prompts), model)
        if not prompts:
            return []
        workers = min(self.max_concurrent_subcalls, len(prompts))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlm-subcall") as pool:
            done = list(pool.map(lambda p: self._subcall(fn, p, model), prompts))
        for _, completion in done:
            if completion is not None:
                self._track(completion)
        return [reply for reply, _ in done]

    # -- helpers ---------------------------------------------------------------------------

    def _live(self) -> Kernel:
        if self._kernel is None:
            raise KernelError("this SunroomEnv was cleaned up; build a new one")
        return self._kernel

    def _run(self, code: str, what: str) -> ExecutionResult:
        result = self._live().execute(code)
        if not result.ok:
            raise KernelError(f"{what} in the kernel failed: {_error_text(result).strip()}")
        return result

    def _install(self) -> None:
        self._run(_INSTALL.format(bound=list(self._bound)), "installing the rlm scaffold")
        for source in self._code_tools:
            self._run(source, "defining a custom tool")
        if self.compaction:
            self._run(_REMEMBER_HISTORY, "restoring history")

    def _bind(self, name: str, value: object) -> None:
        self._live().bind(**{name: value})
        if name not in self._bound:
            self._bound.append(name)
        self._run(_REFRESH.format(bound=[name]), "aliasing the new binding")

    def _bind_history(self) -> None:
        self._live().bind(history=self._compaction_history)
        self._run(_REMEMBER_HISTORY, "binding history")

    def _after_cell(self) -> tuple[str | None, dict[str, str]]:
        result = self._run(_AFTER_CELL, "reading the cell's answer")
        lines = result.stdout.strip().splitlines()
        report = json.loads(lines[-1]) if lines else {}
        final = report.get("final_answer")
        return (None if final is None else str(final)), dict(report.get("locals", {}))


def _error_text(result: ExecutionResult) -> str:
    """The trimmed traceback of a failed cell (ending in ``Type: message``), or ""."""
    if result.error is None:
        return ""
    trace = result.error.traceback.rstrip()
    if trace.rpartition("\n")[2].startswith(f"{result.error.type}:"):
        return "\n" + trace
    return f"\n{trace}\n{result.error.type}: {result.error.message}".rstrip()


# -- registration --------------------------------------------------------------------------

_lock = threading.Lock()
_original: list[Callable[[str, dict[str, Any]], Any]] = []


def register() -> None:
    """Make ``RLM(environment="sunroom", environment_kwargs={...})`` build a :class:`SunroomEnv`.

    rlm hard-codes its environments in ``rlm.environments.get_environment`` (an if/elif over
    names). This replaces that function, in the two modules that hold it
    (``rlm.environments.get_environment`` and the name ``rlm.core.rlm`` imported,
    ``rlm.core.rlm.get_environment``), with a wrapper that builds ``SunroomEnv(**kwargs)`` for
    ``"sunroom"`` and calls the original for every other name. Nothing private is touched.
    Idempotent; :func:`unregister` puts the original back.
    """
    import rlm.core.rlm as core
    import rlm.environments as environments

    with _lock:
        if _original:
            return
        original = environments.get_environment

        def get_environment(environment: str, environment_kwargs: dict[str, Any]) -> Any:
            if environment == ENVIRONMENT:
                return SunroomEnv(**environment_kwargs)
            return original(environment, environment_kwargs)

        get_environment.__doc__ = original.__doc__
        _original.append(original)
        environments.get_environment = get_environment
        core.get_environment = get_environment


def unregister() -> None:
    """Undo :func:`register` (nothing to do when it was not called)."""
    import rlm.core.rlm as core
    import rlm.environments as environments

    with _lock:
        if not _original:
            return
        original = _original.pop()
        environments.get_environment = original
        core.get_environment = original


def registered() -> bool:
    """Whether :func:`register` is in effect."""
    return bool(_original)
