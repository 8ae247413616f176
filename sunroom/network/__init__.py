"""Egress for kernels: a network policy and the host-side proxy that enforces it.

``Network`` says which hosts a kernel may reach and which headers the proxy adds;
``EgressProxy`` serves one kernel on a Unix socket and records every ``Connection``.
See docs/network.md. Names load lazily: the policy alone does not import h11 or cryptography.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["Connection", "EgressProxy", "Network", "Resolver", "ca_bundle", "network_schema"]

_EXPORTS = {
    "Connection": "sunroom.network.proxy",
    "EgressProxy": "sunroom.network.proxy",
    "Network": "sunroom.network.policy",
    "Resolver": "sunroom.network.resolve",
    "ca_bundle": "sunroom.network.ca",
    "network_schema": "sunroom.network.policy",
}

if TYPE_CHECKING:
    from sunroom.network.ca import ca_bundle
    from sunroom.network.policy import Network, network_schema
    from sunroom.network.proxy import Connection, EgressProxy
    from sunroom.network.resolve import Resolver


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sunroom.network' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
