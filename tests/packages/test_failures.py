"""Failed installs: a typed error with pip's reason, and the site dir as it was."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from sunroom import AsyncKernel, PackageInstallError, Packages, UsageError
from tests.packages.servers import stalling_index
from tests.packages.wheels import build_wheel


async def _site_entries(k: AsyncKernel) -> str:
    r = await k.execute("import os\nsorted(os.listdir(os.environ['SUNROOM_SITE']))")
    assert r.ok, r.error
    return r.value or ""


def _pips() -> list[psutil.Process]:
    """pip processes still running under this test process."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "pip" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


async def test_a_package_that_does_not_exist(wheelhouse: Path) -> None:
    async with AsyncKernel(backend="subprocess", packages=Packages(find_links=[wheelhouse])) as k:
        await k.install("toolz")
        before = await _site_entries(k)
        with pytest.raises(PackageInstallError) as caught:
            await k.install("tabulate", "no-such-package==1.0")
        message = str(caught.value)
        assert "No matching distribution found for no-such-package==1.0" in message
        assert await _site_entries(k) == before  # tabulate was not left behind either


async def test_a_package_whose_import_fails_is_not_installed(built_dir: Path) -> None:
    build_wheel(
        built_dir, "brokenpkg", "1.0", {"brokenpkg/__init__.py": b"raise RuntimeError('boom')\n"}
    )
    async with AsyncKernel(backend="subprocess", packages=Packages(find_links=[built_dir])) as k:
        before = await _site_entries(k)
        r = await k.execute("install('brokenpkg')")
        assert r.error is not None and r.error.type == "PackageInstallError"
        assert "import failed: brokenpkg: RuntimeError: boom" in r.error.message
        assert await _site_entries(k) == before == "[]"
        r = await k.execute("import brokenpkg")
        assert r.error is not None and r.error.type == "ModuleNotFoundError"


async def test_a_package_over_the_size_budget(local_backend: str, built_dir: Path) -> None:
    # subprocess: the site dir is measured after pip; bwrap: its tmpfs fills up under pip
    build_wheel(
        built_dir,
        "bigpkg",
        "1.0",
        {"bigpkg/__init__.py": b"", "bigpkg/blob.bin": os.urandom(3 * 2**20)},
    )
    packages = Packages(find_links=[built_dir], max_bytes=2**21)
    async with AsyncKernel(backend=local_backend, packages=packages) as k:
        with pytest.raises(PackageInstallError, match="budget") as caught:
            await k.install("bigpkg")
        assert "2 MB" in str(caught.value)
        assert await _site_entries(k) == "[]"
        r = await k.execute("1 + 1")  # the kernel runs on
        assert r.ok and r.value == "2"


async def test_an_install_over_time_kills_pip_and_its_group() -> None:
    with stalling_index() as url:
        packages = Packages(index_url=url, timeout_s=3)
        async with AsyncKernel(backend="subprocess", packages=packages) as k:
            proc = k.process
            started = time.monotonic()
            with pytest.raises(PackageInstallError, match="ran past its 3 s limit"):
                await k.install("anything")
            assert time.monotonic() - started < 15
            assert _pips() == [] and proc is not None and proc.alive()
            assert await _site_entries(k) == "[]"


async def test_no_network_and_no_wheelhouse_says_so() -> None:
    async with AsyncKernel(backend="subprocess") as k:
        with pytest.raises(PackageInstallError) as caught:
            await k.install("tabulate")
        assert str(caught.value) == (
            "this kernel has no network and no wheelhouse: pass "
            "packages=Packages(find_links=[...]) or network=Network(allow=[...])"
        )
        assert (await k.list_packages()).sources == ()


async def test_requirements_that_are_options_or_empty_are_refused(wheelhouse: Path) -> None:
    async with AsyncKernel(backend="subprocess", packages=Packages(find_links=[wheelhouse])) as k:
        with pytest.raises(UsageError, match="cannot be a pip option"):
            await k.install("--index-url=http://example.invalid/")
        with pytest.raises(UsageError, match="at least one requirement"):
            await k.install()
        with pytest.raises(UsageError, match="above 0 and at most 3600"):
            await k.install("tabulate", timeout_s=0)
        r = await k.execute("install('-r', 'x.txt')")
        assert r.error is not None and r.error.type == "ValueError"


async def test_a_cell_timeout_during_an_install_stops_pip_and_keeps_the_kernel() -> None:
    with stalling_index() as url:
        packages = Packages(index_url=url, timeout_s=120)
        async with AsyncKernel(backend="subprocess", packages=packages) as k:
            await k.execute("kept = 41")
            r = await k.execute("install('anything')", timeout_s=2)
            assert r.status == "timeout" and not r.state_lost, r
            assert _pips() == []
            assert await _site_entries(k) == "[]"  # the staging dir went too
            assert (await k.execute("kept + 1")).value == "42"
