"""install() from a local package index on 127.0.0.1: directly on subprocess (it has the host's
network), and through the egress proxy on bwrap and docker (``network=``), where the index is a
name the proxy maps to loopback and only that name is allowed."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from sunroom import AsyncKernel, InstalledPackage, Network, Packages
from sunroom.network import Connection
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


async def test_install_through_the_egress_proxy(isolated_backend: str, wheelhouse: Path) -> None:
    with simple_index(wheelhouse) as (url, asked):
        port = urlsplit(url).port
        policy = Network(
            allow=[f"pypi.test:{port}"],
            hosts={"pypi.test": "127.0.0.1"},
            allow_addresses=["127.0.0.1"],
        )
        seen: list[Connection] = []
        index = url.replace("127.0.0.1", "pypi.test")
        async with AsyncKernel(
            backend=isolated_backend,
            packages=Packages(index_url=index),
            network=policy,
            env={
                "PIP_TRUSTED_HOST": "pypi.test"
            },  # pip takes plain HTTP only from a name so marked
            on_connection=seen.append,
        ) as k:
            assert await k.install("tabulate==0.9.0") == [InstalledPackage(*TABULATE)]
            r = await k.execute("from tabulate import tabulate\ntabulate([[1]])")
            assert r.ok, r.error
            # pip run by the kernel's own code: the local index works, the real one is refused
            pip = (
                "import os, subprocess, sys\n"
                "def pip(index):\n"
                "    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}\n"
                "    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '-d', 'dl',\n"
                "           '--disable-pip-version-check', '--retries', '0', '--timeout', '10',\n"
                "           '--index-url', index, 'toolz']\n"
                "    return subprocess.run(cmd, env=env, capture_output=True, text=True).returncode\n"
            )
            r = await k.execute(pip + f"(pip({index!r}), pip('https://pypi.org/simple'))")
            assert r.ok, r.error
            assert r.value == "(0, 1)", r.stdout + r.stderr
            listing = await k.execute("import os\nsorted(os.listdir('dl'))")
            assert listing.value == "['toolz-1.0.0-py3-none-any.whl']"
    assert "/files/tabulate-0.9.0-py3-none-any.whl" in asked
    assert {(c.host, c.allowed) for c in seen} >= {("pypi.test", True), ("pypi.org", False)}
    assert all(c.allowed for c in seen if c.host == "pypi.test")
