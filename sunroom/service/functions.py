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
    """Import the host functions each ``module:attribute`` names, in order.

    The attribute is a HostFunction, a callable, or a list or tuple of them. Modules are found
    on ``sys.path`` as it is (the CLI puts the current directory there first). Raises
    UsageError, one sentence naming the spec, for a malformed spec, a module that cannot be
    imported (missing, or its import raised), a missing attribute, or a value that is not a
    host function.
    """
    out: list[HostFunction] = []
    for path in paths:
        module, sep, attr = path.partition(":")
        if not sep or not module or not attr.isidentifier():
            raise UsageError(f"host functions {path!r}: expected module:attribute")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and f"{module}.".startswith(f"{exc.name}."):  # it, a parent
                raise UsageError(
                    f"host functions {path!r}: there is no module {exc.name!r} on the path"
                ) from exc
            raise UsageError(
                f"host functions {path!r}: importing {module!r} failed: {exc}"
            ) from exc
        except Exception as exc:  # the module's own code failed: the user's to fix
            raise UsageError(
                f"host functions {path!r}: importing {module!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not hasattr(found, attr):
            raise UsageError(f"host functions {path!r}: module {module!r} has no {attr!r}")
        obj = getattr(found, attr)
        for item in obj if isinstance(obj, list | tuple) else (obj,):
            try:
                out.append(as_host_function(item))
            except UsageError as exc:
                raise UsageError(f"host functions {path!r}: {exc}") from exc
    return out
