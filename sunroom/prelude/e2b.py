"""TEMPORARY local stub (replaced by the kernel helper's module)."""

import os

_saved = []


def install(envs, cwd=None):
    os.environ.update(envs)
    if cwd is not None:
        os.chdir(cwd)
    return os.getcwd()


def push_env(envs):
    _saved.append({k: os.environ.get(k) for k in envs})
    os.environ.update(envs)


def pop_env():
    for k, v in _saved.pop().items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def pip_install(requirements):
    import importlib.metadata as md
    import re

    missing = []
    for req in requirements:
        name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            missing.append(req)
        else:
            print(f"Requirement already satisfied: {name} ({version})")
    if missing:
        import builtins

        builtins.install(*missing)
