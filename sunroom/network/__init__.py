"""Egress for kernels: a network policy and the host-side proxy that enforces it.

``Network`` says which hosts a kernel may reach and which headers the proxy adds;
``EgressProxy`` serves one kernel on a Unix socket and records every ``Connection``.
See docs/network.md.
"""

from __future__ import annotations

from sunroom.network.ca import ca_bundle
from sunroom.network.policy import Network, network_schema
from sunroom.network.proxy import Connection, EgressProxy
from sunroom.network.resolve import Resolver

__all__ = ["Connection", "EgressProxy", "Network", "Resolver", "ca_bundle", "network_schema"]
