"""A kernel's first module: msgpack imported lean, then the supervisor (the start line's ``main``).

msgpack's ``ext`` module imports ``datetime`` for its ``Timestamp``, and ``datetime.py`` builds
a whole pure-Python implementation before it replaces it with the types of the C module
``_datetime`` (1.1-1.3 ms of a kernel's start on the 2-core VM, and its heap in every idle
kernel). While msgpack is imported here, the name ``datetime`` is ``_datetime`` itself, whose
types are the very objects ``datetime.py`` exports; the name is given back at once, so a cell's
``import datetime`` loads the real module, with the same types as msgpack's timestamps.
"""

from __future__ import annotations

import sys


def import_msgpack() -> None:
    """Import msgpack with ``_datetime`` standing in for ``datetime`` (see the module docstring).

    Does nothing more than a plain import when either is imported already.
    """
    if "datetime" in sys.modules or "msgpack" in sys.modules:
        import msgpack  # noqa: F401 - the plain import

        return
    import _datetime  # type: ignore[import-not-found]  # no stub: the C module itself

    sys.modules["datetime"] = _datetime
    try:
        import msgpack  # noqa: F401 - its ext module takes _datetime as datetime
    finally:
        if sys.modules.get("datetime") is _datetime:
            del sys.modules["datetime"]


def main(config_hex: str) -> None:
    """Import msgpack lean, then run the supervisor with *config_hex* (never returns normally)."""
    import_msgpack()
    from sunroom.prelude.supervisor import main as supervise

    supervise(config_hex)
