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
