"""The build's one step beyond pyproject.toml: the wheel carries the kernels' compiled programs.

``build_py`` compiles ``sunroom/prelude/watch.c`` into ``sunroom/prelude/sunroom-watch`` and
``sunroom/prelude/launch.c`` into ``sunroom/prelude/sunroom-launch`` in the wheel
(``sunroom/sandbox/watcher.py``, loaded by path: the build has none of sunroom's
dependencies). A wheel is then tagged for this platform. Without a C compiler the build says
so and goes on: its kernels watch in Python and start through ``setpriv`` (docs/design.md,
"The watcher", "The launcher"). An editable install leaves the checkout to
``scripts/setup.sh``, which builds them in place.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


def _watcher_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_sunroom_watcher_build", HERE / "sunroom" / "sandbox" / "watcher.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithWatcher(build_py):
    """``build_py``, then the compiled programs built into the build's copy of the package."""

    def run(self) -> None:
        """Copy the package as ``build_py`` does, then compile the programs beside it."""
        super().run()
        if self.editable_mode:
            return
        watcher = _watcher_module()
        for source, built in watcher.PROGRAMS:
            out = Path(self.build_lib) / "sunroom" / "prelude" / built.name
            why = watcher.build(out, source=source)
            if why is not None:
                print(f"sunroom: {built.name} was not built ({why})", file=sys.stderr)


class WithBinary(Distribution):
    """A distribution holding a compiled program: its wheel is tagged for this platform."""

    def has_ext_modules(self) -> bool:
        """Always: the wheel holds ``sunroom-watch`` and ``sunroom-launch``."""
        return True


setup(cmdclass={"build_py": BuildWithWatcher}, distclass=WithBinary)
