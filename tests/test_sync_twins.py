"""The sync twins (Kernel, Session) mirror their async cores exactly and have a clear lifecycle."""

from __future__ import annotations

import inspect
import time

import pytest

from sunroom import AsyncKernel, AsyncSession, Kernel, Session
from sunroom.agent import events as ev
from sunroom.errors import ClosedError
from sunroom.providers import AssistantMessage, TextPart
from sunroom.providers.fakes import ScriptedModel
from sunroom.sandbox.portal import TwinState

FAST = "subprocess"


def _params(cls: type) -> list[tuple[str, object, object, object]]:
    sig = inspect.signature(cls)  # the constructor's parameters
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]


def _state(twin: Kernel | Session) -> TwinState:
    return twin.state


@pytest.mark.parametrize(("sync", "core"), [(Kernel, AsyncKernel), (Session, AsyncSession)])
def test_twins_have_the_same_explicit_signature(sync: type, core: type) -> None:
    # a KernelPool or a Template is bound to the event loop it was made on: async cores only
    loop_bound = {"pool", "template"}
    assert _params(sync) == [p for p in _params(core) if p[0] not in loop_bound]
    assert not any(p[1] is inspect.Parameter.VAR_KEYWORD for p in _params(sync))
    assert not [p for p in _params(core) if p[0].startswith("_")]


@pytest.mark.parametrize(("sync", "core"), [(Kernel, AsyncKernel), (Session, AsyncSession)])
def test_twins_have_every_public_method(sync: type, core: type) -> None:
    async_only = {"aclose"}  # close() is its twin
    public = {n for n in dir(core) if not n.startswith("_")} - async_only
    missing = sorted(n for n in public if not hasattr(sync, n))
    assert missing == []


def test_session_twin_exposes_the_core_attributes() -> None:
    s = Session(model=_model(), backend=FAST)
    try:
        attrs = {n for n in vars(s.core) if not n.startswith("_")}
        assert attrs == {"session_id", "preset", "tracker", "limits", "parent_id", "branch"}
        assert all(getattr(s, n) is getattr(s.core, n) for n in attrs)
    finally:
        s.close()


def test_kernel_close_is_idempotent_and_closed_means_closed() -> None:
    k = Kernel(backend=FAST)
    assert _state(k) is TwinState.UNOPENED
    with k:
        assert _state(k) is TwinState.OPENED
        assert k.execute("1 + 1").value == "2"
    assert _state(k) is TwinState.CLOSED
    k.close()  # a second close does nothing
    k.close()
    with pytest.raises(ClosedError, match="the kernel is closed"):
        k.execute("1")
    with pytest.raises(ClosedError):
        k.start()


def _model() -> ScriptedModel:
    return ScriptedModel([AssistantMessage([TextPart("done")])] * 4)


def test_session_lifecycle_and_closed_errors() -> None:
    s = Session(model=_model(), backend=FAST)
    assert _state(s) is TwinState.UNOPENED and not s.running
    s.start()
    assert _state(s) is TwinState.OPENED
    result = s.run("hello")
    assert result.status == "success", result
    assert not s.running
    assert any("hello" in repr(m) for m in s.messages)
    s.cancel()  # no-op when idle
    s.close()
    s.close()
    assert _state(s) is TwinState.CLOSED
    with pytest.raises(ClosedError, match="the session is closed"):
        s.run("again")


def test_session_events_unsubscribe_when_the_consumer_stops_early() -> None:
    with Session(model=_model(), backend=FAST) as s:
        bus = s.core._parts.bus
        events = s.events()
        s.send("hi")
        first = next(events)
        assert isinstance(first, ev.Event)
        assert len(bus._subscribers) == 1
        events.close()  # the consumer stops early
        deadline = time.monotonic() + 5
        while bus._subscribers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bus._subscribers == []
        assert s.result().status == "success"


def test_the_files_twin_mirrors_kernel_files() -> None:
    from sunroom.sandbox.files import Files, KernelFiles

    def methods(cls: type) -> dict[str, list[str]]:
        return {
            name: list(inspect.signature(getattr(cls, name)).parameters)
            for name in dir(cls)
            if not name.startswith("_")
        }

    assert methods(Files) == methods(KernelFiles)
    assert isinstance(inspect.getattr_static(Kernel, "files"), property)
    assert isinstance(inspect.getattr_static(AsyncKernel, "files"), property)
