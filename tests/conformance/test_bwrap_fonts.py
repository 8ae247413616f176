"""bwrap kernels draw with matplotlib's font cache built once per host and mounted read-only."""

from __future__ import annotations

import pytest

from sunroom import AsyncKernel, Limits
from tests.conftest import _require

DRAW = (
    "import logging\nlogging.basicConfig(level=logging.INFO)\n"  # matplotlib says when it builds
    "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nNone"
)


@pytest.fixture
def bwrap() -> None:
    _require("bwrap")


async def test_a_bwrap_kernel_draws_without_fontconfig_errors_or_a_font_scan(bwrap: None) -> None:
    for _ in range(2):  # the first kernel of this layout may build the host's cache: both use it
        async with AsyncKernel(backend="bwrap", limits=Limits(timeout_s=60)) as k:
            r = await k.execute(DRAW)
            assert r.ok and len(r.outputs) == 1, r
            assert "Fontconfig error" not in r.stderr, r.stderr
            assert "generated new fontManager" not in r.stderr, r.stderr  # no rebuild
            assert "building the font cache" not in r.stderr
            where = await k.execute(
                "import matplotlib, os\n"
                "d = matplotlib.get_cachedir()\n"
                "name = [f for f in os.listdir(d) if f.startswith('fontlist')][0]\n"
                "try:\n"
                "    open(os.path.join(d, name), 'a')\n"
                "    ro = False\n"
                "except OSError:\n"
                "    ro = True\n"
                "d, ro, os.listdir('.')"
            )
            # in the kernel's private /tmp, the cache read-only, nothing left in the workdir
            assert where.value == "('/tmp/matplotlib', True, [])", where
