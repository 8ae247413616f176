"""install() from a wheelhouse on subprocess, bwrap and docker: real kernels, real wheels."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sunroom import AsyncKernel, InstalledPackage, Packages, Template
from sunroom.sandbox.backend import SITE_ENV
from tests.packages.wheels import TABULATE, TOOLZ, build_wheel


async def test_install_in_a_cell_then_import_in_the_next(
    install_backend: str, wheelhouse: Path
) -> None:
    packages = Packages(find_links=[wheelhouse])
    async with AsyncKernel(backend=install_backend, packages=packages) as k:
        r = await k.execute("install('tabulate==0.9.0')")
        assert r.ok, r.error
        assert r.value == "[('tabulate', '0.9.0')]"
        r = await k.execute(
            "import os, tabulate\n"
            "print(tabulate.tabulate([[1, 2]], headers=['a', 'b']))\n"
            "tabulate.__file__.startswith(os.environ['SUNROOM_SITE'])"
        )
        assert r.ok, r.error
        assert r.value == "True" and "a    b" in r.stdout
        got = await k.install("toolz==1.0.0")  # the host API: same work, over RPC
        assert got == [InstalledPackage(*TOOLZ)]
        r = await k.execute("import toolz; toolz.__version__")
        assert r.ok and r.value == "'1.0.0'", r.error
        listing = await k.list_packages()
        mine = [p for p in listing.packages if p.site]
        assert [(p.name, p.version) for p in mine] == [TABULATE, TOOLZ]
        assert listing.sources == ("wheelhouse",)


async def test_the_site_dir_is_on_sys_path_survives_cells_and_goes_with_the_kernel(
    install_backend: str, wheelhouse: Path
) -> None:
    packages = Packages(find_links=[wheelhouse])
    async with AsyncKernel(backend=install_backend, packages=packages) as k:
        r = await k.execute(
            "import os, sys\nsite = os.environ['SUNROOM_SITE']\n"
            "(sys.path.index(site), os.access(site, os.W_OK))"
        )
        assert r.ok and r.value == "(1, True)", r  # after sunroom, before site-packages
        await k.install("tabulate")
        r = await k.execute("x = 1")
        r = await k.execute("import tabulate; sorted(os.listdir(site))")
        assert r.ok and "'tabulate'" in (r.value or ""), r
        assert ".staging" not in (r.value or "")
        site = (await k.execute("site")).value
    if install_backend == "subprocess":  # the host path itself: removed with the kernel
        assert site is not None
        assert not await asyncio.to_thread(os.path.exists, site.strip("'"))
    async with AsyncKernel(backend=install_backend, packages=packages) as fresh:
        r = await fresh.execute("import tabulate")
        assert r.error is not None and r.error.type == "ModuleNotFoundError"


async def test_a_newer_version_replaces_an_older_one_and_wins_over_the_venv(
    built_dir: Path,
) -> None:
    # iniconfig is in the venv (a pytest dependency): the site dir comes first on sys.path
    build_wheel(built_dir, "iniconfig", "99.0", {"iniconfig/__init__.py": b"V = 'site 99'\n"})
    build_wheel(built_dir, "iniconfig", "100.0", {"iniconfig/__init__.py": b"V = 'site 100'\n"})
    packages = Packages(find_links=[built_dir])
    async with AsyncKernel(backend="subprocess", packages=packages) as k:
        assert await k.install("iniconfig==99.0") == [InstalledPackage("iniconfig", "99.0")]
        r = await k.execute("import iniconfig; iniconfig.V")
        assert r.ok and r.value == "'site 99'", r
        await k.install("iniconfig==100.0")
        r = await k.execute(
            "import os\n"
            "sorted(n for n in os.listdir(os.environ['SUNROOM_SITE']) if 'dist-info' in n)"
        )
        assert r.value == "['iniconfig-100.0.dist-info']", r  # the old version is gone
        listing = await k.list_packages()
        assert [(p.name, p.version) for p in listing.packages if p.site] == [("iniconfig", "100.0")]


async def test_a_template_setup_installs_and_its_kernels_see_the_packages(
    local_backend: str, wheelhouse: Path
) -> None:
    packages = Packages(find_links=[wheelhouse])
    setup = "install('tabulate==0.9.0')\nimport tabulate"
    async with Template(setup=setup, backend=local_backend, packages=packages) as t:
        k = await t.kernel()
        try:
            assert k.packages == packages
            r = await k.execute("tabulate.__version__")  # imported by the setup
            assert r.ok and r.value == "'0.9.0'", r
            await k.install("toolz")  # the fork shares the template's site dir (docs)
            r = await k.execute(f"import toolz, os; os.environ[{SITE_ENV!r}]")
            assert r.ok, r
        finally:
            await k.aclose()
