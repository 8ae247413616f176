"""Packages on demand inside the kernel: the ``install()`` builtin and what is importable.

The backend gives every kernel a writable **site dir** (``$SUNROOM_SITE``: a size-capped tmpfs
at ``/site`` on bwrap and docker, ``<rundir>/site`` on subprocess) and the host's package
settings as JSON in ``$SUNROOM_PACKAGES`` (wheelhouse directories as the kernel sees them, an
index URL, the size and time budget). At boot :func:`add_site` puts the site dir on
``sys.path`` right after sunroom's own package, before the read-only site-packages: a package
installed here wins over the venv's copy, so a newer version can be installed.

``install("pkg==1.2", ...)`` runs pip **inside the sandbox, as the kernel**, in a process group
of its own, into a fresh staging directory inside the site dir; then checks the budget, imports
each new distribution's top-level names in a fresh interpreter, and only then moves the files
into the site dir (replacing older versions of the same distributions). Any failure raises
:class:`PackageInstallError` with pip's reason and leaves the site dir as it was. The host's
``kernel.install`` calls the same code over RPC (``install_packages``). Standard library only;
``subprocess`` and ``importlib.metadata`` are imported at the first call.
"""

from __future__ import annotations

import builtins
import os
import sys

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any, Final

SITE_ENV: Final = "SUNROOM_SITE"
"""The environment variable naming the kernel's writable site dir."""
CONFIG_ENV: Final = "SUNROOM_PACKAGES"
"""The environment variable holding the host's package settings (JSON)."""
DEFAULT_MAX_BYTES: Final = 512 * 2**20
DEFAULT_TIMEOUT_S: Final = 300.0
MAX_REASON: Final = 2048
"""Longest reason (characters) a :class:`PackageInstallError` carries from pip's output."""
STAGING: Final = ".staging-"
"""Prefix of the per-install staging directories inside the site dir."""
PROXY_VARS: Final = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
NO_SOURCE: Final = (
    "this kernel has no network and no wheelhouse: pass packages=Packages(find_links=[...]) "
    "or network=Network(allow=[...])"
)
_VERIFY: Final = (
    "import sys, json, importlib\n"
    "sys.path[:] = json.loads(sys.argv[1])\n"
    "bad = []\n"
    "for name in json.loads(sys.argv[2]):\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except BaseException as exc:\n"
    "        bad.append(f'{name}: {type(exc).__name__}: {exc}')\n"
    "print(json.dumps(bad))\n"
)


class PackageInstallError(Exception):
    """An ``install()`` failed (pip, budget, time or import check); the site dir is unchanged."""


def site_dir() -> str | None:
    """The kernel's writable site dir, or None when the backend gave it none."""
    return os.environ.get(SITE_ENV) or None


def config() -> dict[str, Any]:
    """The host's package settings, with defaults for what it left out."""
    import json

    raw = os.environ.get(CONFIG_ENV)
    found: dict[str, Any] = json.loads(raw) if raw else {}
    return {
        "find_links": list(found.get("find_links") or ()),
        "index_url": found.get("index_url"),
        "extra_index_urls": list(found.get("extra_index_urls") or ()),
        "max_bytes": int(found.get("max_bytes") or DEFAULT_MAX_BYTES),
        "timeout_s": float(found.get("timeout_s") or DEFAULT_TIMEOUT_S),
        "network": bool(found.get("network")) or any(os.environ.get(v) for v in PROXY_VARS),
    }


def add_site() -> None:
    """Put the site dir on ``sys.path`` after sunroom's own entry (the kernel calls this once)."""
    site = site_dir()
    if site is None or site in sys.path:
        return
    os.makedirs(site, exist_ok=True)  # an importer is only made for a directory that exists
    sys.path.insert(1 if sys.path else 0, site)


def install_builtins() -> None:
    """Make ``install`` and ``PackageInstallError`` builtins (the kernel calls this once)."""
    builtins.install = install  # type: ignore[attr-defined]
    builtins.PackageInstallError = PackageInstallError  # type: ignore[attr-defined]


def install(*requirements: str, timeout_s: float | None = None) -> list[tuple[str, str]]:
    """Install *requirements* (pip requirement strings) into this kernel; importable at once.

    pip runs in the sandbox, as the kernel, against the wheelhouse and/or index the host
    configured (or the network, when the kernel has one). Each installed distribution's
    top-level modules are imported in a fresh interpreter before this returns. Returns the
    ``(name, version)`` of every distribution installed, dependencies included. Raises
    PackageInstallError (pip's reason, cut to 2 KiB) on any failure, leaving the site dir as it
    was; ValueError for an empty or option-like requirement.
    """
    return [(d["name"], d["version"]) for d in install_packages(requirements, timeout_s)]


def install_packages(requirements: object, timeout_s: float | None = None) -> list[dict[str, str]]:
    """The work of :func:`install`: ``[{"name", "version"}]`` of what was installed."""
    import shutil
    import tempfile
    import time

    reqs = _check(requirements)
    cfg = config()
    limit = cfg["timeout_s"] if timeout_s is None else float(timeout_s)
    if limit <= 0:
        raise ValueError("timeout_s must be positive")
    site = site_dir()
    if site is None:
        raise PackageInstallError("this kernel has no writable site dir to install into")
    sources = _source_args(cfg)
    deadline = time.monotonic() + limit
    os.makedirs(site, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=STAGING, dir=site)
    try:
        argv = [
            sys.executable, "-s", "-m", "pip", "install", "--target", staging, "--no-input",
            "--disable-pip-version-check", "--no-cache-dir", "--progress-bar", "off",
            *sources, "--", *reqs,
        ]  # fmt: skip
        code, out, err = _run(argv, deadline, limit, "pip", _pip_env(site))
        if code != 0 and "No space left on device" in err:
            raise OSError(28, "No space left on device")
        if code != 0:
            raise PackageInstallError(f"pip could not install {', '.join(reqs)}: {_reason(err)}")
        used = _size(site)  # the staging dir included
        if used > cfg["max_bytes"]:
            mb = cfg["max_bytes"] / 2**20
            raise PackageInstallError(
                f"the install would bring the site dir to {used / 2**20:.1f} MB, over its "
                f"{mb:g} MB budget (Packages(max_bytes=...))"
            )
        dists = _distributions(staging)
        _verify(staging, site, dists, deadline, limit)
        _commit(staging, site, [d["name"] for d in dists])
    except OSError as exc:
        if getattr(exc, "errno", None) == 28:  # ENOSPC: the tmpfs is full
            raise PackageInstallError(
                "the site dir ran out of space (its budget is "
                f"{cfg['max_bytes'] / 2**20:g} MB, Packages(max_bytes=...))"
            ) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    import importlib

    importlib.invalidate_caches()
    sys.path_importer_cache.pop(site, None)
    return [{"name": d["name"], "version": d["version"]} for d in dists]


def listing() -> dict[str, object]:
    """The distributions importable in this kernel, and where installs may come from.

    ``{"packages": [{"name", "version", "site"}], "site": path or None, "sources": [...]}``;
    ``site`` is True for what :func:`install` put in the site dir; ``sources`` names
    ``"wheelhouse"``, ``"index"`` and ``"network"`` as configured. Names and versions come
    from the ``.dist-info`` / ``.egg-info`` directory names on ``sys.path`` (no metadata file
    is read: about 1 ms for a venv of 150 distributions); the first on the path wins, as in
    an import.
    """
    site = site_dir()
    seen: dict[str, dict[str, Any]] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for item in names:
            if not item.endswith((".dist-info", ".egg-info")) or "-" not in item:
                continue
            name, _, version = item.rpartition(".")[0].partition("-")
            version = version.split("-")[0]
            key = _normal(name)
            if key in seen or not name or item.startswith(STAGING):
                continue
            seen[key] = {"name": name.replace("_", "-"), "version": version, "site": entry == site}
    cfg = config()
    sources = [
        s
        for s, on in (
            ("wheelhouse", cfg["find_links"]),
            ("index", cfg["index_url"] or cfg["extra_index_urls"]),
            ("network", cfg["network"]),
        )
        if on
    ]
    packages = sorted(seen.values(), key=lambda d: d["name"].lower())
    return {"packages": packages, "site": site, "sources": sources}


# -- helpers ---------------------------------------------------------------------------------


def _check(requirements: Any) -> list[str]:
    reqs = list(requirements)
    if not reqs:
        raise ValueError("install() needs at least one requirement, e.g. install('tabulate')")
    for req in reqs:
        if not isinstance(req, str) or not req.strip():
            raise ValueError(f"a requirement must be a non-empty str, not {req!r}")
        if req.strip().startswith("-"):
            raise ValueError(f"a requirement cannot be a pip option: {req!r}")
    return [r.strip() for r in reqs]


def _source_args(cfg: dict[str, Any]) -> list[str]:
    """The pip index arguments for *cfg*; PackageInstallError when there is nowhere to look."""
    args: list[str] = []
    for link in cfg["find_links"]:
        args += ["--find-links", link]
    if cfg["index_url"]:
        args += ["--index-url", cfg["index_url"]]
    for url in cfg["extra_index_urls"]:
        args += ["--extra-index-url", url]
    if not cfg["index_url"] and not cfg["network"]:
        if not cfg["find_links"]:
            raise PackageInstallError(NO_SOURCE)
        args.append("--no-index")
    return args


def _pip_env(site: str) -> dict[str, str]:
    """The kernel's environment, its sys.path (less the site dir) as PYTHONPATH, no pip.conf."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and p != site)
    env["PIP_NO_WARN_SCRIPT_LOCATION"] = "1"
    env.setdefault("PIP_CONFIG_FILE", os.devnull)  # the machine's pip.conf is not the kernel's
    return env


def _run(
    argv: list[str], deadline: float, limit: float, what: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run *argv* in a process group of its own; kill the whole group past *deadline*."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=max(0.01, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc, signal)
        raise PackageInstallError(
            f"the install ran past its {limit:g} s limit ({what} was stopped)"
        ) from None
    except BaseException:
        _kill(proc, signal)  # an interrupt (the cell's timeout): pip's whole group goes too
        raise
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _kill(proc: Any, signal: Any) -> None:
    try:  # noqa: SIM105 - contextlib costs the kernel an import
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone
    proc.communicate()


def _reason(stderr: str) -> str:
    """The reason pip gave: its ``ERROR:`` lines (else its last lines), cut to MAX_REASON."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    text = "\n".join(errors or lines[-5:]) or "pip failed and said nothing"
    return text if len(text) <= MAX_REASON else "..." + text[-(MAX_REASON - 3) :]


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _normal(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions(staging: str) -> list[dict[str, Any]]:
    """The distributions pip put in *staging*: name, version and top-level import names."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions(path=[staging]):
        found.append(
            {"name": dist.metadata["Name"], "version": dist.version, "modules": _modules(dist)}
        )
    return sorted(found, key=lambda d: str(d["name"]).lower())


def _modules(dist: Any) -> list[str]:
    """The top-level modules of *dist*: ``top_level.txt``, else its RECORD's top entries."""
    text = dist.read_text("top_level.txt")
    if text:
        names = {n.strip() for n in text.splitlines() if n.strip()}
    else:
        names = set()
        for file in dist.files or ():
            parts = file.parts
            top = parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "bin", "__pycache__"):
                continue
            if len(parts) > 1:
                names.add(top)
            elif top.endswith(".py"):
                names.add(top[:-3])
            elif ".cpython-" in top or top.endswith((".so", ".pyd")):
                names.add(top.split(".")[0])
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_"))


def _verify(
    staging: str, site: str, dists: list[dict[str, Any]], deadline: float, limit: float
) -> None:
    """Import every new top-level module in a fresh interpreter with the kernel's sys.path."""
    import json

    names = [m for d in dists for m in d["modules"]]
    if not names:
        return
    path = list(sys.path)
    path.insert(path.index(site) if site in path else 1, staging)
    argv = [sys.executable, "-I", "-S", "-c", _VERIFY, json.dumps(path), json.dumps(names)]
    code, out, err = _run(argv, deadline, limit, "the import check")
    try:
        bad = json.loads(out.strip().splitlines()[-1]) if code == 0 else [_reason(err)]
    except (ValueError, IndexError):
        bad = [_reason(err)]
    if bad:
        text = "; ".join(bad)
        text = text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
        raise PackageInstallError(f"installed, but the import failed: {text}")


def _commit(staging: str, site: str, names: list[str]) -> None:
    """Move *staging*'s files into *site*, removing older versions of the same distributions."""
    import shutil
    from importlib import metadata

    wanted = {_normal(n) for n in names}
    for old in metadata.distributions(path=[site]):
        if _normal(old.metadata["Name"] or "") not in wanted:
            continue
        for file in old.files or ():
            target = os.path.realpath(os.path.join(site, str(file)))
            if target.startswith(os.path.realpath(site) + "/") and os.path.isfile(target):
                os.unlink(target)
        shutil.rmtree(str(old._path), ignore_errors=True)  # type: ignore[attr-defined]
    for entry in os.listdir(staging):
        dest = os.path.join(site, entry)
        if os.path.isdir(dest) and not os.path.islink(dest):
            _merge(os.path.join(staging, entry), dest)
        else:
            if os.path.lexists(dest):
                os.unlink(dest)
            os.rename(os.path.join(staging, entry), dest)


def _merge(src: str, dest: str) -> None:
    """Move the tree *src* into the existing directory *dest* (a namespace package, ``bin``)."""
    for entry in os.listdir(src):
        s, d = os.path.join(src, entry), os.path.join(dest, entry)
        if os.path.isdir(d) and not os.path.islink(d) and os.path.isdir(s):
            _merge(s, d)
            continue
        if os.path.isdir(d) and not os.path.islink(d):
            import shutil

            shutil.rmtree(d)
        elif os.path.lexists(d):
            os.unlink(d)
        os.rename(s, d)
