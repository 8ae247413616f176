"""Packages settings are checked when made; the kernel gets them as it sees them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sunroom import AsyncKernel, KernelPool, Packages, UsageError
from sunroom.sandbox.packages import (
    MAX_FIND_LINKS,
    InstalledPackage,
    PackageListing,
    notable_line,
)


def test_defaults() -> None:
    p = Packages()
    assert p.max_bytes == 512 * 2**20 and p.timeout_s == 300.0
    assert p.find_links == () and p.index_url is None and p.extra_index_urls == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"find_links": "/tmp"}, "a list of directories"),
        ({"find_links": ["/no/such/dir"]}, "is not a directory"),
        ({"find_links": ["/tmp"] * (MAX_FIND_LINKS + 1)}, f"at most {MAX_FIND_LINKS}"),
        ({"index_url": "ftp://x/simple"}, "http(s) URL"),
        ({"index_url": "http:///simple"}, "http(s) URL"),
        ({"extra_index_urls": "http://x/simple"}, "a list of URLs"),
        ({"max_bytes": 2**20 - 1}, "between 1 MiB and 64 GiB"),
        ({"max_bytes": 64 * 2**30 + 1}, "between 1 MiB and 64 GiB"),
        ({"max_bytes": 1.5}, "must be an int"),
        ({"timeout_s": 0}, "above 0 and at most 3600"),
        ({"timeout_s": 3601}, "above 0 and at most 3600"),
        ({"timeout_s": True}, "number of seconds"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Packages(**kwargs)  # type: ignore[arg-type]


def test_wheelhouses_are_mounted_where_the_kernel_sees_them(tmp_path: Path) -> None:
    p = Packages(find_links=[tmp_path, str(tmp_path)], index_url="http://127.0.0.1:9/simple/")
    assert [(m.source, m.target) for m in p.mounts("bwrap")] == [
        (str(tmp_path), "/packages/0"),
        (str(tmp_path), "/packages/1"),
    ]
    assert p.mounts("subprocess") == ()
    docker = json.loads(p.env("docker")["SUNROOM_PACKAGES"])
    assert docker["find_links"] == ["/packages/0", "/packages/1"]
    assert json.loads(p.env("subprocess")["SUNROOM_PACKAGES"])["find_links"] == [str(tmp_path)] * 2
    assert docker["index_url"] == "http://127.0.0.1:9/simple/"


def test_a_kernel_takes_only_packages_and_a_pool_none() -> None:
    with pytest.raises(UsageError, match="must be a sunroom.Packages"):
        AsyncKernel(backend="subprocess", packages={"find_links": []})  # type: ignore[arg-type]
    pool = KernelPool(backend="subprocess", size=1)
    with pytest.raises(UsageError, match="before its packages are known"):
        AsyncKernel(pool=pool, packages=Packages())


def test_the_notable_line_names_notable_and_installed_packages_only() -> None:
    listing = PackageListing(
        (
            InstalledPackage("numpy", "2.0", site=False),
            InstalledPackage("scikit-learn", "1.5", site=False),
            InstalledPackage("pytest", "8.0", site=False),
            InstalledPackage("tabulate-extra", "0.1", site=True),
        ),
        ("wheelhouse", "network"),
    )
    assert notable_line(listing) == (
        "Notable packages in the kernel: numpy 2.0, scikit-learn 1.5 (import sklearn), "
        'tabulate-extra 0.1. install("name==version", ...) installs more into the kernel from '
        "its wheelhouse and network; the import works in the next line."
    )
