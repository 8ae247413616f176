"""A hostile kernel sending garbage display outputs breaks the protocol: data, then a restart.

The kernel's own ``execute`` handler is swapped from inside a cell for one that returns what
the runtime would, with its display items replaced; the host must refuse each shape (a died
result saying the protocol was broken, the kernel restarted), never raise or keep the garbage.
"""

from __future__ import annotations

import json

import pytest

from sunroom import AsyncKernel, Limits

ITEM = "{'output_type': 'display_data', 'data': {'text/plain': 'x'}, 'metadata': {}}"
SWAPS = {
    "outputs not a list": "out['outputs'] = 'x'",
    "png as str": "out['outputs'] = [{**"
    + ITEM
    + ", 'data': {'image/png': 'iVBOR', 'text/plain': 'x'}}]",
    "html as bytes": "out['outputs'] = [{**"
    + ITEM
    + ", 'data': {'text/html': b'<b>', 'text/plain': 'x'}}]",
    "no text/plain": "out['outputs'] = [{**" + ITEM + ", 'data': {'text/html': 'x'}}]",
    "wrong output_type": "out['outputs'] = [{**" + ITEM + ", 'output_type': 'stream'}]",
    "too many items": "out['outputs'] = [" + ITEM + "] * 101",
    "over the byte cap": "out['outputs'] = [{**"
    + ITEM
    + ", 'data': {'text/plain': 'x' * 200_000}}]",
    "metadata not a map": "out['outputs'] = [{**" + ITEM + ", 'metadata': '{'}]",
    "json with a bytes key": "out['outputs'] = [{**"
    + ITEM
    + ", 'data': {'application/json': {b'k': 1}, 'text/plain': 'x'}}]",
    "negative dropped": "out['dropped_outputs'] = -5",
}


@pytest.mark.parametrize("name", list(SWAPS))
async def test_garbage_outputs_are_a_protocol_break(isolated_backend: str, name: str) -> None:
    limits = Limits(timeout_s=20, max_display_bytes=100_000)
    async with AsyncKernel(backend=isolated_backend, limits=limits) as k:
        install = (
            "import gc\n"
            "from sunroom.prelude.runtime import Runtime\n"
            "rt = next(o for o in gc.get_objects() if isinstance(o, Runtime))\n"
            "orig = rt._do_execute\n"
            "def evil(params):\n"
            "    out = orig(params)\n"
            f"    {SWAPS[name]}\n"
            "    return out\n"
            "rt._do_execute = evil\n"
            "'swapped'"
        )
        assert (await k.execute(install)).value == "'swapped'"
        r = await k.execute("1")
        json.dumps(r.to_dict())
        assert r.status == "died" and r.state_lost, r
        assert r.error is not None and "broke the protocol" in r.error.message
        assert len(r.error.message) < 600
        assert (await k.execute("1 + 1")).value == "2"
