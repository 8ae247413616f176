"""The rlm environment's scaffold, as code in the kernel sees it (``sunroom.integrations.rlm``).

:class:`~sunroom.integrations.rlm.SunroomEnv` runs :func:`install` as a cell after every kernel
(re)start and :func:`after_cell` as a cell after each of the model's cells. Together they give
the kernel's namespace the names rlm's system prompt promises, with the semantics of rlm's own
environments:

* ``answer``: a dict; setting ``answer["ready"] = True`` during a cell makes that cell's
  ``content`` (as ``str``) the final answer. Rebinding ``answer`` to a plain dict with
  ``ready`` true counts too; the name is then wrapped again for the next cell.
* ``SHOW_VARS()``: the user's variables and their type names.
* ``context``/``history`` alias ``context_0``/``history_0`` (or the compaction list), and the
  reserved helpers (the host functions ``llm_query`` ... ``rlm_query_batched``, ``SHOW_VARS``)
  are put back after a cell that overwrote them.

:func:`after_cell` prints one JSON line: the final answer (or null) and a short ``repr`` of each
user variable (never the full repr of a large value). Standard library only.
"""

from __future__ import annotations

import json
import reprlib
import sys
import types

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, MutableMapping
    from typing import Final

__all__ = [
    "AnswerDict",
    "after_cell",
    "install",
    "refresh",
    "remember_history",
    "reset_answer",
]

HELPERS: Final = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")
"""The host functions SunroomEnv serves; restored from the generated module after each cell."""

_GENERATED: Final = "sunroom_functions"
_SHORT = reprlib.Repr()
_SHORT.maxstring = 100
_SHORT.maxother = 100
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 8


class AnswerDict(dict):  # type: ignore[type-arg]  # the model's own dict: any keys and values
    """``{"content": "", "ready": False}``; setting ``ready`` to a true value reports content."""

    def __init__(self, on_ready: Callable[[object], None]) -> None:
        super().__init__(content="", ready=False)
        self._on_ready = on_ready

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key, value)
        if key == "ready" and value:
            self._on_ready(self.get("content", ""))


class _Scaffold:
    """The per-kernel state: the names present before the user's, the captured answer."""

    def __init__(self, ns: MutableMapping[str, object], bound: Iterable[str]) -> None:
        self.ns = ns
        self.captured: str | None = None
        self.history: object = None  # the compaction list, once the host bound one
        # the kernel's own names (prelude helpers, host functions), not the host's bindings
        self.baseline = set(ns) | {"SHOW_VARS", *HELPERS}
        self.add_bound(bound)

    def add_bound(self, bound: Iterable[str]) -> None:
        self.baseline -= {"answer", *bound}

    def capture(self, content: object) -> None:
        self.captured = str(content)

    def new_answer(self) -> AnswerDict:
        return AnswerDict(self.capture)

    def user_names(self) -> list[str]:
        return [
            name
            for name, value in self.ns.items()
            if not name.startswith("_")
            and name not in self.baseline
            and not isinstance(value, types.ModuleType)
        ]

    def show_vars(self) -> str:
        """The variables the code made (and the context), with their type names."""
        available = {
            name: type(self.ns[name]).__name__ for name in self.user_names() if name != "answer"
        }
        if not available:
            return "No variables created yet. Use ```repl``` blocks to create variables."
        return f"Available variables: {available}"

    def restore(self) -> None:
        generated = sys.modules.get(_GENERATED)
        for name in HELPERS:
            fn = getattr(generated, name, None)
            if fn is not None:
                self.ns[name] = fn
        self.ns["SHOW_VARS"] = self.show_vars
        answer = self.ns.get("answer")
        if not isinstance(answer, AnswerDict):
            replacement = self.new_answer()
            if isinstance(answer, dict):
                dict.update(replacement, answer)
                if answer.get("ready") and self.captured is None:
                    self.captured = str(answer.get("content", ""))
            self.ns["answer"] = replacement
        if "context_0" in self.ns:
            self.ns["context"] = self.ns["context_0"]
        if self.history is not None:
            self.ns["history"] = self.history
        elif "history_0" in self.ns:
            self.ns["history"] = self.ns["history_0"]


_state: _Scaffold | None = None


def _scaffold(ns: MutableMapping[str, object]) -> _Scaffold:
    if _state is None or _state.ns is not ns:
        raise RuntimeError("the rlm scaffold is not installed in this namespace")
    return _state


def install(ns: MutableMapping[str, object], bound: Iterable[str] = ()) -> None:
    """Put ``answer`` and ``SHOW_VARS`` into *ns* (the kernel's namespace); run once per start.

    *bound* names the values the host bound (contexts, histories, data tools): they are the
    user's variables even when they are already there (after a restart).
    """
    global _state
    _state = _Scaffold(ns, bound)
    _state.restore()


def refresh(ns: MutableMapping[str, object], bound: Iterable[str]) -> None:
    """Count *bound* (names the host just bound) as the user's, and restore the aliases."""
    state = _scaffold(ns)
    state.add_bound(bound)
    state.restore()


def after_cell(ns: MutableMapping[str, object]) -> None:
    """Restore the scaffold, then print ``{"final_answer": ..., "locals": {...}}`` as JSON."""
    state = _scaffold(ns)
    state.restore()
    final, state.captured = state.captured, None
    shown = {name: _SHORT.repr(ns[name]) for name in state.user_names()}
    print(json.dumps({"final_answer": final, "locals": shown}))


def reset_answer(ns: MutableMapping[str, object]) -> None:
    """A fresh ``answer`` (a new turn of a persistent environment) and no captured answer."""
    state = _scaffold(ns)
    state.captured = None
    ns["answer"] = state.new_answer()


def remember_history(ns: MutableMapping[str, object]) -> None:
    """Keep the ``history`` just bound (the compaction list) as the one to restore."""
    _scaffold(ns).history = ns.get("history")
