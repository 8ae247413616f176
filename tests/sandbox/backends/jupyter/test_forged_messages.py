"""A Jupyter kernel whose code forges IOPub messages: the host never raises on them.

The kernel's code holds the connection key, so it can publish anything, signed. Before, such a
message made jupyter-client raise inside the host (``AttributeError`` for a parent header that
is a str, ``KeyError`` for a header without ``msg_type``, ``JSONDecodeError``, ``TypeError``)
and ``execute`` raised it, or the cell's collection logged a traceback and dropped it. Now each
is checked (``sunroom.sandbox.backends.jupyter.messages``, ``sunroom.sandbox.backends.jupyter.results``): ignored and counted
(one warning per cell), or dropped as a display, and the cell's result stays sane.
"""

from __future__ import annotations

import json
import logging

import pytest

from sunroom import AsyncKernel, ExecutionResult, JupyterBackend, Limits

LIMITS = Limits(timeout_s=20, interrupt_grace_s=1.0, start_timeout_s=30)

FORGER = r"""
import json as _json
_k = get_ipython().kernel
_s = _k.session

def _part(value):
    return value if isinstance(value, bytes) else _json.dumps(value, default=str).encode()

def forge(kind='stream', content=None, *, header=None, parent=None, metadata=None, frames=None):
    '''Publish one signed message on IOPub, as a child of the running cell unless told.'''
    if frames is None:
        head = _s.msg_header(kind) if header is None else header
        mine = _k.get_parent('shell')['header'] if parent is None else parent
        parts = [_part(p) for p in (head, mine, {} if metadata is None else metadata, content)]
        frames = [b'forged', b'<IDS|MSG>', _s.sign(parts), *parts]
    _k.iopub_socket.send_multipart(frames)

def cell_parent():
    return _k.get_parent('shell')['header']
"""

FORGED = {
    # not a message at all: ignored and counted
    "content is a list": "forge('display_data', [1, 2])",
    "content is a str": "forge('stream', 'text')",
    "header is a str": "forge(content={}, header='oops')",
    "parent header is a str": "forge('stream', {'name': 'stdout', 'text': 'x'}, parent='oops')",
    "header without msg_type": (
        "h = _s.msg_header('stream'); del h['msg_type']\n"
        "forge(content={'name': 'stdout', 'text': 'x'}, header=h)"
    ),
    "msg_type is a number": "h = _s.msg_header('stream'); h['msg_type'] = 5\nforge(content={}, header=h)",
    "content is not JSON": "forge('stream', b'{not json')",
    "content holds NaN": 'forge(\'stream\', b\'{"name": "stdout", "text": NaN}\')',
    "content nested 5000 deep": "forge('display_data', b'{\"data\": ' + b'[' * 5000 + b']' * 5000 + b'}')",
    "content nested 40 deep": "forge('display_data', b'{\"data\": ' + b'[' * 40 + b']' * 40 + b'}')",
    "a bad signature": (
        "p = [_part(x) for x in (_s.msg_header('stream'), cell_parent(), {}, "
        "{'name': 'stdout', 'text': 'forged'})]\n"
        "forge(frames=[b'<IDS|MSG>', b'0' * 64, *p])"
    ),
    "too few frames": "forge(frames=[b'<IDS|MSG>', b'sig', b'{}'])",
    "no delimiter": "forge(frames=[b'a', b'b', b'c', b'd', b'e', b'f'])",
    "stream text is a number": "forge('stream', {'name': 'stdout', 'text': 5})",
    "stream name is unknown": "forge('stream', {'name': 'stdlog', 'text': 'x'})",
    "execute_result data is a str": "forge('execute_result', {'data': 'x', 'metadata': {}})",
    "status state is a number": "forge('status', {'execution_state': 5})",
}
"""Each forged message, as kernel code; each is ignored and counted."""

DROPPED = {
    # displays that cannot be used: dropped and counted in dropped_outputs
    "display data is a list": "forge('display_data', {'data': [1], 'metadata': {}})",
    "display data is null": "forge('display_data', {'data': None})",
    "a mime type of 200 characters": (
        "forge('display_data', {'data': {'text/' + 'x' * 200: 'y'}, 'metadata': {}})"
    ),
}


def _sane(r: ExecutionResult) -> None:
    json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")
    assert not r.state_lost, r


@pytest.fixture(params=["none", "bwrap"])
def sandbox(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_forged_iopub_messages_never_make_the_host_raise(
    sandbox: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    backend = JupyterBackend("python3", sandbox=sandbox)
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        assert (await k.execute(FORGER + "\nkept = 42")).ok
        for name, code in FORGED.items():
            caplog.clear()
            r = await k.execute(code + "\nprint('after')\n6 * 7")
            _sane(r)
            assert r.ok and r.stdout == "after\n" and r.value == "42", (name, r)
            assert r.outputs == () and r.dropped_outputs == 0, (name, r)
            warnings = [rec.getMessage() for rec in caplog.records]
            assert any("sent 1 messages" in text for text in warnings), (name, warnings)
            assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], name
        for name, code in DROPPED.items():
            caplog.clear()
            r = await k.execute(code + "\nprint('after')")
            _sane(r)
            assert r.ok and r.stdout == "after\n", (name, r)
            assert r.outputs == () and r.dropped_outputs == 1, (name, r)
            assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], name

        # fields of the wrong type in a usable message: the rest of it is kept
        r = await k.execute(
            "forge('display_data', {'data': {'text/plain': 't'}, 'metadata': 5, 'transient': []})"
        )
        _sane(r)
        assert r.ok and [o.data for o in r.outputs] == [{"text/plain": "t"}], r
        assert r.outputs[0].metadata == {}
        # a forged error is the cell's error, its fields of the wrong type replaced
        r = await k.execute(
            "forge('error', {'ename': ['x'], 'evalue': {}, 'traceback': 'tb'})\nprint('after')"
        )
        _sane(r)
        assert r.status == "error" and r.error is not None, r
        assert (r.error.type, r.error.message, r.error.traceback) == ("Error", "", "")
        # a lone surrogate spelled in JSON reaches the host escaped, as valid UTF-8
        r = await k.execute('forge(\'stream\', b\'{"name": "stdout", "text": "x\\\\ud800\\\\n"}\')')
        _sane(r)
        assert r.ok and r.stdout == "x\\ud800\n", r
        # bytes that are not UTF-8 (jupyter-client's packer sends surrogateescape'd text so)
        r = await k.execute('forge(\'stream\', b\'{"name": "stdout", "text": "a\\xff"}\')')
        _sane(r)
        assert r.ok and r.stdout == "a\ufffd", r
        # a message of another cell (a stale parent) is not this cell's
        r = await k.execute(
            "forge('stream', {'name': 'stdout', 'text': 'stale'}, parent={'msg_id': 'old'})"
        )
        assert r.ok and r.stdout == "", r
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        r = await k.execute("kept")
        assert r.ok and r.value == "42", r
