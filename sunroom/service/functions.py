"""Host functions named on a command line or in the service's configuration (``module:attr``).

Importing them needs no web framework, so ``sunroom run`` and ``sunroom serve`` share this.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from sunroom.errors import UsageError
from sunroom.sandbox.functions import HostFunction, as_host_function

__all__ = ["load_functions"]


def load_functions(paths: Sequence[str]) -> list[HostFunction]:
    """Import ``module:attribute`` host functions. Raises UsageError."""
    out = []
    for path in paths:
        module, _, attr = path.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"cannot load host function {path!r}: {exc}") from exc
        out.append(as_host_function(obj))
    return out
