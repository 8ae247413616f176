"""What an E2B code-interpreter sandbox does inside its kernel, for the service's E2B facade.

E2B's sandbox template starts its Jupyter kernel with a few startup scripts that its SDK (and
users' code) rely on. A sandbox of sunroom's facade gets the same with one cell, run right after
its kernel starts, that leaves no name in the user's namespace::

    __import__("sunroom.prelude.e2b", fromlist=["install"]).install({"VAR": "value"})

:func:`install` (idempotent: twice is once; it imports neither pandas nor Pillow):

* sets the sandbox's environment variables and keeps them as its defaults; per execution,
  :func:`push_env` sets a request's variables before the user's cell and :func:`pop_env`
  restores exactly what was there before after it (a variable that was absent is removed, a
  sandbox default comes back);
* adds display formatters (:func:`sunroom.prelude.display.add_formatter`): a ``dict`` or
  ``list`` gets ``application/json`` when it is JSON (numpy values as Python numbers, dates as
  ISO strings, NaN and infinities as null, non-str keys as str, as E2B's orjson does; over
  :data:`MAX_JSON_VALUES` values or :data:`MAX_JSON_BYTES` it is left out and the item's
  metadata says why); a pandas ``DataFrame`` (only once the user imported pandas) gets
  ``e2b/data``, its ``to_dict(orient="list")`` as **JSON text** (timestamps as ISO strings, NaT,
  NA and NaN as null, other values JSON as above or their ``str``), within
  :data:`MAX_DATA_CELLS` cells and :data:`MAX_DATA_BYTES`. It is text because a display item's
  value is a str unless its mime type is JSON (``application/json``, ``+json``): the wire, the
  Jupyter backend and ``.ipynb`` files all hold that rule; the facade parses it into E2B's
  ``data`` dict;
* makes Pillow show images in a headless kernel, as E2B's template does, once ``PIL.Image``
  or ``PIL.ImageShow`` is imported (:mod:`sunroom.prelude.postimport`; at once if already
  loaded): ``Image.show()`` displays the image (a viewer put first in ``ImageShow``'s list, so
  no external program runs) and ``Image.save(path)`` with a ``str`` path displays it and then
  saves it (what E2B's SDK test ``test_get_image_on_save`` depends on);
* answers ``!pip install ...`` lines, which the facade rewrites to :func:`pip_install`: an
  installed distribution named bare is reported as pip reports it, the rest is installed
  through the kernel's ``install()``;
* makes IPython's ``display`` (``from IPython.display import display``: E2B's kernels are
  IPython's, so users' code imports it) show through sunroom's
  :func:`~sunroom.prelude.display.display` (``raw=`` and ``metadata=`` honoured, the rest of
  IPython's keywords ignored) once IPython loads, instead of printing the objects as IPython
  does outside its shell; inside an IPython shell (the Jupyter backend) IPython's own runs.

On the Jupyter backend (an IPython shell) Pillow's images show through IPython's ``display``
and IPython's ``display`` stays its own; the formatters do not apply there (IPython renders
values and displays itself). :func:`uninstall` takes the formatters and every patch away
again. Standard library only.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import os
import re
import sys

from sunroom.prelude import display, postimport

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import types
    from collections.abc import Mapping
    from typing import Any, Final

MAX_JSON_VALUES: Final = 10_000
"""Values (numbers, strings, list and map entries) of a dict or list given ``application/json``;
a cell's display items hold at most 50,000 (:data:`sunroom.prelude.display.MAX_VALUES`)."""
MAX_JSON_BYTES: Final = 1 << 20
"""Bytes of a dict or list as JSON text, at most, to be given ``application/json``."""
MAX_DATA_CELLS: Final = 200_000
"""Cells (rows x columns) of a DataFrame, at most, to be given ``e2b/data``."""
MAX_DATA_BYTES: Final = 2 << 20
"""Bytes of a DataFrame's ``e2b/data`` JSON text, at most (a cell's items hold 8 MiB)."""
_MAX_DEPTH: Final = 32
_INT_RANGE: Final = (-(1 << 63), (1 << 64) - 1)  # what msgpack carries
_NULLS: Final = frozenset({"NaTType", "NAType"})  # pandas' missing values, by type name
_MARK: Final = "_sunroom_e2b"
_BARE_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_IPYTHON_DISPLAYS: Final = ("IPython.core.display_functions", "IPython.display")
"""Where IPython's ``display`` is defined, and where it is imported for its users."""

_DEFAULTS: dict[str, str] = {}
"""The sandbox's environment variables, as :func:`install` set them."""
_SAVED: list[dict[str, str | None]] = []
"""What :func:`push_env` changed: each variable's value before it (None: it was absent)."""


def install(envs: Mapping[str, str], cwd: str | None = None) -> str:
    """Set up the kernel as E2B's sandbox template does; return the working directory.

    Sets *envs* in ``os.environ`` (they become the sandbox's defaults), changes to *cwd* when
    given, and adds the formatters and patches of the module docstring. Raises
    TypeError when *envs* is not a map of str to str (nothing is set then), OSError when *cwd*
    cannot be entered.
    """
    checked = _checked(envs)
    if cwd is not None:
        os.chdir(cwd)
    os.environ.update(checked)
    _DEFAULTS.update(checked)
    display.add_formatter("application/json", json_value)
    display.add_formatter("e2b/data", dataframe_data)
    postimport.after_import("PIL.Image", patch_image)
    postimport.after_import("PIL.ImageShow", patch_image_show)
    for name in _IPYTHON_DISPLAYS:
        postimport.after_import(name, patch_ipython_display)
    return os.getcwd()


def uninstall() -> None:
    """Take away what :func:`install` added (environment variables stay as they are)."""
    display.remove_formatter("application/json")
    display.remove_formatter("e2b/data")
    postimport.remove("PIL.Image", patch_image)
    postimport.remove("PIL.ImageShow", patch_image_show)
    for name in _IPYTHON_DISPLAYS:
        postimport.remove(name, patch_ipython_display)
        module = sys.modules.get(name)
        shown = getattr(module, "display", None)
        if getattr(shown, _MARK, False):
            module.display = shown.__wrapped__  # type: ignore[union-attr]
    image = sys.modules.get("PIL.Image")
    if image is not None:
        save = getattr(image.Image, "save", None)
        if getattr(save, _MARK, False):
            image.Image.save = save.__wrapped__  # type: ignore[union-attr]
    show = sys.modules.get("PIL.ImageShow")
    if show is not None:
        show._viewers[:] = [v for v in show._viewers if not isinstance(v, DisplayViewer)]


def defaults() -> dict[str, str]:
    """The sandbox's environment variables as :func:`install` set them."""
    return dict(_DEFAULTS)


def push_env(envs: Mapping[str, str]) -> None:
    """Set *envs* for one execution; :func:`pop_env` restores what was there before.

    One execution at a time: a push whose pop never came (the cell before was cut short) is
    undone first. Raises TypeError when *envs* is not a map of str to str (nothing is set).
    """
    checked = _checked(envs)
    pop_env()
    _SAVED.append({name: os.environ.get(name) for name in checked})
    os.environ.update(checked)


def pop_env() -> None:
    """Restore the variables the last :func:`push_env` set (none pushed: nothing happens)."""
    while _SAVED:
        for name, value in _SAVED.pop().items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _checked(envs: Mapping[str, str]) -> dict[str, str]:
    if not hasattr(envs, "items"):
        raise TypeError(
            f"environment variables must be a map of str to str, not a {type(envs).__name__}"
        )
    out = dict(envs.items())
    for name, value in out.items():
        named = isinstance(name, str) and name and "=" not in name and "\0" not in name
        if not named or not isinstance(value, str) or "\0" in value:
            raise TypeError(f"environment variable {name!r} must be a name and a str value")
    return out


def pip_install(requirements: list[str]) -> None:
    """``!pip install REQ ...`` in a cell of an E2B sandbox (the facade rewrites it to this).

    A requirement that is a bare distribution name already installed prints pip's
    ``Requirement already satisfied: NAME (VERSION)``; the others (a version, extras, a URL, a
    name not installed) go through the kernel's ``install()``
    (:func:`sunroom.prelude.packages.install`) and what it installed is printed as pip prints
    it. Raises what ``install()`` raises (PackageInstallError, ValueError), which fails the
    cell as a failed ``!pip`` fails E2B's.
    """
    import importlib.metadata

    from sunroom.prelude import packages

    missing: list[str] = []
    for requirement in requirements:
        if _BARE_NAME.fullmatch(requirement) is None:
            missing.append(requirement)
            continue
        try:
            version = importlib.metadata.version(requirement)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
        else:
            print(f"Requirement already satisfied: {requirement} ({version})")
    if missing:
        installed = packages.install(*missing)
        names = " ".join(f"{name}-{version}" for name, version in installed)
        print(f"Successfully installed {names}" if names else "Nothing new was installed")


# -- formatters -------------------------------------------------------------------------------


def json_value(obj: object) -> object:
    """*obj* as ``application/json`` when it is a ``dict`` or ``list`` that is JSON, else None.

    Raises ValueError when it holds more than :data:`MAX_JSON_VALUES` values or
    :data:`MAX_JSON_BYTES` of JSON text (the display item's metadata says so).
    """
    if not isinstance(obj, dict | list):
        return None
    budget = [MAX_JSON_VALUES]
    try:
        value = _json(obj, budget, lenient=False)
    except TypeError:  # not JSON (an object, a set, too deep): no application/json, as E2B
        return None
    except _OverBudget:
        raise ValueError(
            f"a {type(obj).__name__} of more than {MAX_JSON_VALUES:,} values is not given as "
            "application/json"
        ) from None
    size = len(json.dumps(value, ensure_ascii=False, allow_nan=False))
    if size > MAX_JSON_BYTES:
        raise ValueError(
            f"a {type(obj).__name__} of {size:,} bytes of JSON is over the {MAX_JSON_BYTES:,} "
            "given as application/json"
        )
    return value


def dataframe_data(obj: object) -> str | None:
    """A pandas DataFrame's columns as JSON text (E2B's ``e2b/data``), else None.

    Never imports pandas: only a DataFrame of the pandas in ``sys.modules`` is one. Raises
    ValueError when it has more than :data:`MAX_DATA_CELLS` cells or its JSON text is over
    :data:`MAX_DATA_BYTES`.
    """
    pandas = sys.modules.get("pandas")
    frame = getattr(pandas, "DataFrame", None)
    if not isinstance(frame, type) or not isinstance(obj, frame):
        return None
    df: Any = obj
    cells = int(df.size)
    if cells > MAX_DATA_CELLS:
        raise ValueError(
            f"a DataFrame of {cells:,} cells is over the {MAX_DATA_CELLS:,} given as e2b/data"
        )
    budget = [2 * MAX_DATA_CELLS]  # nested values (lists in cells) count too
    try:
        value = _json(df.to_dict(orient="list"), budget, lenient=True)
    except _OverBudget:
        raise ValueError(
            f"the DataFrame holds more than {2 * MAX_DATA_CELLS:,} values, too many for e2b/data"
        ) from None
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if len(text) > MAX_DATA_BYTES:
        raise ValueError(
            f"the DataFrame's {len(text):,} bytes of JSON are over the {MAX_DATA_BYTES:,} "
            "given as e2b/data"
        )
    return text


class _OverBudget(Exception):
    """A value holds more values than its formatter gives (an internal signal, never raised out)."""


def _json(value: object, budget: list[int], *, lenient: bool, depth: int = 0) -> object:
    """*value* as plain JSON data.

    Raises TypeError when it is not JSON (*lenient*: its ``str`` instead, but for nesting over
    32 deep), _OverBudget after ``budget[0]`` values.
    """
    budget[0] -= 1
    if budget[0] < 0:
        raise _OverBudget
    if depth > _MAX_DEPTH:
        raise TypeError("nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        if _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            return int(value)
        return _other(value, lenient)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if type(value).__name__ in _NULLS:
        return None
    if isinstance(value, dict):
        return {
            _key(k, lenient): _json(v, budget, lenient=lenient, depth=depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_json(v, budget, lenient=lenient, depth=depth + 1) for v in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if type(value).__module__ == "numpy":  # a numpy scalar (item) or array (tolist)
        plain = getattr(value, "tolist", None)
        size = getattr(value, "size", 1)
        if isinstance(size, int) and size > budget[0]:
            raise _OverBudget  # before tolist() copies a large array
        if plain is not None:
            return _json(plain(), budget, lenient=lenient, depth=depth)
    return _other(value, lenient)


def _key(key: object, lenient: bool) -> str:
    """A map key as JSON has it (orjson's ``OPT_NON_STR_KEYS``: numbers, bools, None)."""
    if isinstance(key, str):
        return str(key)
    if type(key).__module__ == "numpy" and hasattr(key, "item"):
        key = key.item()
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    if lenient:
        return str(key)
    raise TypeError(f"a {type(key).__name__} key is not JSON")


def _other(value: object, lenient: bool) -> str:
    if lenient:
        return str(value)
    raise TypeError(f"a {type(value).__name__} is not JSON")


# -- Pillow -----------------------------------------------------------------------------------


class DisplayViewer:
    """A viewer in Pillow's ``ImageShow`` list: shows the image as a display item of the cell."""

    def show(self, image: object, **options: object) -> int:
        """Display *image*; 1 tells Pillow it was shown (no other viewer runs)."""
        _display(image)
        return 1


def patch_image(module: types.ModuleType) -> None:
    """Make ``Image.save(path)`` with a str path display the image first (idempotent)."""
    image_class: Any = module.Image
    save = image_class.save
    if getattr(save, _MARK, False):
        return

    def save_and_display(self: object, fp: object, format: object = None, **params: Any) -> None:
        if isinstance(fp, str):
            _display(self)
        save(self, fp, format, **params)

    save_and_display.__wrapped__ = save  # type: ignore[attr-defined]
    save_and_display.__doc__ = save.__doc__
    save_and_display.__name__ = save_and_display.__qualname__ = "save"
    setattr(save_and_display, _MARK, True)
    image_class.save = save_and_display


def patch_image_show(module: types.ModuleType) -> None:
    """Put a :class:`DisplayViewer` first among Pillow's viewers (idempotent)."""
    viewers: list[object] = module._viewers
    if not any(isinstance(v, DisplayViewer) for v in viewers):
        viewers.insert(0, DisplayViewer())


def _display(obj: object) -> None:
    """Show *obj*: through IPython inside its shell (the Jupyter backend), else sunroom's way."""
    if _in_ipython_shell():
        importlib.import_module("IPython.core.display_functions").display(obj)
    else:
        display.display(obj)


def _in_ipython_shell() -> bool:
    shell = sys.modules.get("IPython.core.interactiveshell")
    return shell is not None and bool(shell.InteractiveShell.initialized())


# -- IPython ----------------------------------------------------------------------------------


def patch_ipython_display(module: types.ModuleType) -> None:
    """Make *module*'s ``display`` (IPython's) show through sunroom's outside a shell (idempotent).

    ``IPython.core.display_functions`` gets the wrapper; ``IPython.display``, which imported
    the original before the patch (IPython loaded before :func:`install`), gets the same one.
    """
    original = getattr(module, "display", None)
    if original is None or getattr(original, _MARK, False):
        return
    if module.__name__ != _IPYTHON_DISPLAYS[0]:
        defined = getattr(sys.modules.get(_IPYTHON_DISPLAYS[0]), "display", None)
        if getattr(defined, _MARK, False) and getattr(defined, "__wrapped__", None) is original:
            setattr(module, "display", defined)  # noqa: B010 - a module's attribute, by name
        return

    def display_through_sunroom(
        *objs: object, raw: bool = False, metadata: dict[str, object] | None = None, **kw: Any
    ) -> object:
        if _in_ipython_shell():
            return original(*objs, raw=raw, metadata=metadata, **kw)
        display.display(*objs, raw=raw, metadata=metadata)
        return None

    display_through_sunroom.__wrapped__ = original  # type: ignore[attr-defined]
    display_through_sunroom.__doc__ = original.__doc__
    display_through_sunroom.__name__ = display_through_sunroom.__qualname__ = "display"
    setattr(display_through_sunroom, _MARK, True)
    setattr(module, "display", display_through_sunroom)  # noqa: B010
