"""The CLI's network options: ``--allow-host``, ``--network FILE`` and ``serve --network``.

A policy file is JSON in the shape of :meth:`sunroom.Network.to_json` (``allow``, ``inject``,
``tls``, ...). Its injected headers are read on this host and go to the proxy only; they are
never printed, stored with a session, or passed to a kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sunroom.cli.support import fail, read_json
from sunroom.errors import SunroomError

if TYPE_CHECKING:
    from sunroom.network.policy import Network

__all__ = ["named_networks", "network_from", "read_policy"]


def read_policy(path: Path, *, what: str) -> dict[str, Any]:
    """The JSON object in *path*, checked as a policy; exits 2 with one line otherwise."""
    from sunroom.network.policy import Network

    data = read_json(path, what=what)
    if not isinstance(data, dict):
        raise fail(f"{what} {path} must hold a JSON object (allow, inject, tls, ...)")
    try:
        Network.from_json(data)
    except SunroomError as exc:
        raise fail(f"{what} {path}: {exc}") from None
    return data


def network_from(allow_hosts: list[str], policy: Path | None) -> Network | None:
    """The policy of ``--allow-host`` entries and a ``--network FILE`` (None: no network)."""
    if not allow_hosts and policy is None:
        return None
    from sunroom.network.policy import Network

    data = read_policy(policy, what="the network policy") if policy is not None else {}
    data["allow"] = [*(data.get("allow") or ()), *allow_hosts]
    try:
        return Network.from_json(data)
    except SunroomError as exc:
        raise fail(f"--allow-host: {exc}") from None


def named_networks(specs: list[str]) -> dict[str, dict[str, object]] | None:
    """``serve --network NAME=FILE`` (repeatable) as the service's ``networks``."""
    named: dict[str, dict[str, object]] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name.isidentifier() or not file:
            raise fail(f"--network {spec!r} must be NAME=FILE with NAME a Python identifier")
        if name in named:
            raise fail(f"--network names {name!r} twice")
        named[name] = read_policy(Path(file), what=f"network {name!r}")
    return named or None


AllowHostOption = typer.Option(
    "--allow-host",
    metavar="HOST",
    help="A host the kernel may reach through sunroom's egress proxy (repeatable; "
    "*.example.com and host:port work; bwrap and docker only; docs/network.md).",
)
