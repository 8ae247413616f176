"""install() from a local package index on 127.0.0.1 (the subprocess backend has the host's
network; installs through the egress proxy on bwrap and docker are tested with the network)."""

from __future__ import annotations

from pathlib import Path

from sunroom import AsyncKernel, InstalledPackage, Packages
from tests.packages.servers import simple_index
from tests.packages.wheels import TABULATE


async def test_install_from_a_local_index(wheelhouse: Path) -> None:
    with simple_index(wheelhouse) as (url, asked):
        packages = Packages(index_url=url)
        async with AsyncKernel(backend="subprocess", packages=packages) as k:
            assert await k.install("tabulate==0.9.0") == [InstalledPackage(*TABULATE)]
            r = await k.execute("from tabulate import tabulate\ntabulate([[1]])")
            assert r.ok, r.error
            assert (await k.list_packages()).sources == ("index",)
    assert "/simple/tabulate/" in asked
    assert "/files/tabulate-0.9.0-py3-none-any.whl" in asked


async def test_a_package_the_index_lacks_is_pips_reason(wheelhouse: Path) -> None:
    with simple_index(wheelhouse) as (url, asked):
        async with AsyncKernel(backend="subprocess", packages=Packages(index_url=url)) as k:
            r = await k.execute(
                "try:\n    install('no-such-package-here')\n"
                "except PackageInstallError as exc:\n    print(exc)"
            )
            assert r.ok, r.error
            assert "No matching distribution found for no-such-package-here" in r.stdout
    assert "/simple/no-such-package-here/" in asked
