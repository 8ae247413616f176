"""Text the kernel's code makes that UTF-8 cannot encode (lone surrogates), on every backend.

A lone surrogate (``"\\ud800"``, or a file name decoded with ``surrogateescape``) in a value's
repr, a display item, an exception, printed output, a host call's argument, a variable's repr or
a file name reaches the host as its backslash escape (``\\ud800``, six ASCII characters), as the
kernel's ``print`` writes it: the kernel keeps its state, and the host only ever holds text
that encodes as UTF-8. Before, the answer to ``execute`` could not be encoded, the kernel was
killed and its namespace lost.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from sunroom import AsyncKernel, ExecutionResult, Limits

SURROGATE_REPR = """
class Odd:
    def __repr__(self):
        return 'odd\\ud800'

class OddHtml:
    def _repr_html_(self):
        return '<b>\\udcff</b>'
    def __repr__(self):
        return 'html\\ud800'
"""

received: list[str] = []


def echo(text: str) -> int:
    """Record *text* on the host; its length."""
    received.append(text)
    return len(text)


def _utf8(result: ExecutionResult) -> None:
    """Every string of *result* encodes as UTF-8 (json without ensure_ascii says so)."""
    json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8")


async def _state_kept(k: AsyncKernel) -> None:
    r = await k.execute("kept")
    assert r.ok and r.value == "42", r


@pytest.fixture
async def kernel(backend: str) -> AsyncIterator[AsyncKernel]:
    received.clear()
    async with AsyncKernel(backend=backend, functions=[echo], limits=Limits(timeout_s=30)) as k:
        assert (await k.execute("kept = 42\n" + SURROGATE_REPR)).ok
        yield k


async def test_a_value_whose_repr_has_a_lone_surrogate(kernel: AsyncKernel) -> None:
    r = await kernel.execute("'\\ud800'")  # a str's repr escapes it already
    assert r.ok and r.value == "'\\ud800'", r
    r = await kernel.execute("Odd()")  # a repr that does not
    assert r.ok, r
    assert r.value is not None and "odd\\ud800" in r.value
    _utf8(r)
    await _state_kept(kernel)


async def test_display_items_with_lone_surrogates(kernel: AsyncKernel) -> None:
    r = await kernel.execute("display(Odd(), OddHtml())")
    assert r.ok, r
    plain = [str(item.data.get("text/plain")) for item in r.outputs]
    assert any("odd\\ud800" in text for text in plain), r.outputs
    assert any(item.data.get("text/html") == "<b>\\udcff</b>" for item in r.outputs), r.outputs
    _utf8(r)
    await _state_kept(kernel)


async def test_an_exception_message_with_a_lone_surrogate(kernel: AsyncKernel) -> None:
    r = await kernel.execute("raise ValueError('bad \\ud800 value')")
    assert r.status == "error" and r.error is not None, r
    assert r.error.type == "ValueError"
    assert r.error.message == "bad \\ud800 value"
    assert "bad \\ud800 value" in r.error.traceback
    _utf8(r)
    await _state_kept(kernel)


async def test_printed_lone_surrogates(kernel: AsyncKernel) -> None:
    r = await kernel.execute(
        "print('out \\ud800')\nimport sys\nprint('err \\udcff', file=sys.stderr)"
    )
    assert r.ok, r
    assert r.stdout == "out \\ud800\n"
    assert r.stderr == "err \\udcff\n"
    _utf8(r)
    await _state_kept(kernel)


async def test_a_host_call_argument_with_a_lone_surrogate(kernel: AsyncKernel) -> None:
    r = await kernel.execute("echo('arg \\ud800')")
    assert r.ok and r.value == "10", r  # the host received 'arg \\ud800': 10 characters
    assert received == ["arg \\ud800"]
    await _state_kept(kernel)


async def test_a_variable_repr_with_a_lone_surrogate(kernel: AsyncKernel) -> None:
    assert (await kernel.execute("odd = Odd()")).ok
    shown = {v.name: v for v in await kernel.variables()}
    assert shown["odd"].repr == "odd\\ud800"
    await _state_kept(kernel)


async def test_a_file_name_that_is_not_utf8(kernel: AsyncKernel) -> None:
    code = "import os\nos.close(os.open(b'caf\\xff', os.O_CREAT | os.O_WRONLY))"
    assert (await kernel.execute(code)).ok
    paths = [info.path for info in await kernel.files.list("caf*")]
    assert paths == ["caf\\udcff"]  # the name as os.listdir decodes it, escaped
    await _state_kept(kernel)
