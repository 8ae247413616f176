"""Packages on demand, host side: :class:`Packages` settings, installs over RPC, the prompt line.

A kernel started with ``packages=Packages(find_links=[...])`` gets each wheelhouse directory
mounted read-only (bwrap, docker: at ``/packages/<n>``; subprocess: the host path itself) and
the settings as JSON in ``$SUNROOM_PACKAGES``; its backend gives it a writable site dir of
``max_bytes`` (``$SUNROOM_SITE``). pip itself runs only inside the kernel
(:mod:`sunroom.prelude.packages`): an sdist's build runs arbitrary code, never on the host.
See docs/packages.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from sunroom.errors import UsageError
from sunroom.sandbox.backend import DEFAULT_SITE_BYTES, InputMount

__all__ = ["InstalledPackage", "PackageListing", "Packages", "notable_line"]

WHEELHOUSE_DIR: Final = "/packages"
"""Where the bwrap and docker backends mount the wheelhouse directories (``/packages/<n>``)."""
CONFIG_ENV: Final = "SUNROOM_PACKAGES"
MAX_FIND_LINKS: Final = 16
"""Wheelhouse directories one kernel may be given."""
MAX_TIMEOUT_S: Final = 3600.0
"""Longest ``timeout_s`` of one install."""
RPC_SLACK_S: Final = 30.0
"""How much longer than an install's own limit the host waits for the kernel's answer."""

NOTABLE: Final = frozenset(
    {
        "numpy", "pandas", "polars", "pyarrow", "scipy", "scikit-learn", "statsmodels",
        "matplotlib", "seaborn", "plotly", "pillow", "opencv-python", "sympy", "networkx",
        "torch", "tensorflow", "jax", "xgboost", "lightgbm", "transformers", "tiktoken",
        "requests", "httpx", "aiohttp", "beautifulsoup4", "lxml", "html5lib", "pydantic",
        "pyyaml", "openpyxl", "xlsxwriter", "duckdb", "sqlalchemy", "tabulate", "toolz",
        "rich", "regex", "python-dateutil", "pytz", "tqdm", "jinja2", "markdown", "pypdf",
        "shapely", "geopandas", "numba", "h5py", "zarr", "xarray", "scikit-image",
    }
)  # fmt: skip
"""Well-known data, science, ML and web distributions the system prompt names when present."""
IMPORT_NAMES: Final = {
    "pillow": "PIL",
    "scikit-learn": "sklearn",
    "scikit-image": "skimage",
    "beautifulsoup4": "bs4",
    "pyyaml": "yaml",
    "python-dateutil": "dateutil",
    "opencv-python": "cv2",
}
"""Notable distributions imported under another name; the prompt says which."""


PACKAGES_HEADING: Final = "Notable packages in the kernel"
"""How the system prompt's packages line starts."""


@dataclass(frozen=True, slots=True)
class Packages:
    """Where ``install()`` finds packages, and its budget.

    Args:
        find_links: host directories of wheels (wheelhouses), mounted read-only into the
            kernel; pip looks there first. Without an index or network, pip uses only them.
        index_url: a package index (PEP 503 simple API) the kernel can reach, e.g. a local
            mirror; replaces PyPI.
        extra_index_urls: further indexes.
        max_bytes: size of the kernel's writable site dir (all installs together).
        timeout_s: time one ``install()`` may take (pip and the import check).
    """

    find_links: Sequence[str | os.PathLike[str]] = ()
    index_url: str | None = None
    extra_index_urls: Sequence[str] = ()
    max_bytes: int = DEFAULT_SITE_BYTES
    timeout_s: float = 300.0
    resolved: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.find_links, str | os.PathLike):
            raise UsageError("find_links must be a list of directories, not one path")
        links = tuple(self.find_links)
        if len(links) > MAX_FIND_LINKS:
            raise UsageError(f"find_links takes at most {MAX_FIND_LINKS} directories")
        resolved = []
        for link in links:
            path = Path(link).expanduser().resolve()
            if not path.is_dir():
                raise UsageError(f"the wheelhouse {str(link)!r} is not a directory")
            resolved.append(str(path))
        object.__setattr__(self, "find_links", links)
        object.__setattr__(self, "resolved", tuple(resolved))
        if isinstance(self.extra_index_urls, str):
            raise UsageError("extra_index_urls must be a list of URLs, not one URL")
        object.__setattr__(self, "extra_index_urls", tuple(self.extra_index_urls))
        for url in (self.index_url, *self.extra_index_urls):
            if url is None:
                continue
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise UsageError(f"an index URL must be an http(s) URL, not {url!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int):
            raise UsageError("max_bytes must be an int")
        if not 2**20 <= self.max_bytes <= 64 * 2**30:
            raise UsageError("max_bytes must be between 1 MiB and 64 GiB")
        check_timeout(self.timeout_s)

    def mounts(self, backend: str) -> tuple[InputMount, ...]:
        """The read-only wheelhouse mounts *backend* must make (none for subprocess)."""
        if backend == "subprocess":
            return ()
        return tuple(
            InputMount(src, f"{WHEELHOUSE_DIR}/{i}") for i, src in enumerate(self.resolved)
        )

    def env(self, backend: str) -> dict[str, str]:
        """``$SUNROOM_PACKAGES`` for a kernel of *backend*: the settings as the kernel sees them."""
        links = [m.target for m in self.mounts(backend)] if backend != "subprocess" else []
        settings = {
            "find_links": links or list(self.resolved),
            "index_url": self.index_url,
            "extra_index_urls": list(self.extra_index_urls),
            "max_bytes": self.max_bytes,
            "timeout_s": self.timeout_s,
        }
        return {CONFIG_ENV: json.dumps(settings)}


def check_timeout(timeout_s: object) -> float:
    """*timeout_s* as a float; UsageError unless it is a number above 0 and at most 3,600."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise UsageError("timeout_s must be a number of seconds")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise UsageError(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g} s")
    return float(timeout_s)


@dataclass(frozen=True, slots=True)
class InstalledPackage:
    """A distribution importable in a kernel: its name and version; ``site`` if install() put it."""

    name: str
    version: str
    site: bool = True


@dataclass(frozen=True, slots=True)
class PackageListing:
    """What a kernel can import (``packages``) and where install() may look (``sources``).

    ``sources`` names ``"wheelhouse"``, ``"index"`` and ``"network"``, as configured.
    """

    packages: tuple[InstalledPackage, ...]
    sources: tuple[str, ...]


def installed(rows: Iterable[Mapping[str, Any]]) -> list[InstalledPackage]:
    """The kernel's answer rows as :class:`InstalledPackage` records."""
    return [
        InstalledPackage(str(r["name"]), str(r["version"]), bool(r.get("site", True))) for r in rows
    ]


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _shown(package: InstalledPackage) -> str:
    imported = IMPORT_NAMES.get(_normal(package.name))
    return f"{package.name} {package.version}" + (f" (import {imported})" if imported else "")


def notable_line(listing: PackageListing) -> str:
    """One compact system-prompt line: notable importable packages, and how to get more."""
    shown = [p for p in listing.packages if p.site or _normal(p.name) in NOTABLE]
    names = ", ".join(_shown(p) for p in shown) or "none of the usual ones"
    where = list(listing.sources)
    if not where:
        how = "install() cannot reach a package index here (no network and no wheelhouse)."
    else:
        how = (
            'install("name==version", ...) installs more into the kernel from its '
            f"{' and '.join(where)}; the import works in the next line."
        )
    return f"{PACKAGES_HEADING}: {names}. {how}"
