"""Everything that runs inside the kernel: supervisor, runtime, cell executor, output capture.

Imports only the standard library, ``msgpack`` and ``sunroom.rpc``; never host code. A minimal
kernel image carries just ``sunroom/__init__.py``, ``sunroom/rpc`` and ``sunroom/prelude``.

Code in a cell may import the host-function exceptions from here::

    from sunroom.prelude.hostcall import HostFunctionError
"""
