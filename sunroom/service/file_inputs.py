"""A session's file inputs: pinned when it is created, checked when they are bound again.

A request's ``files`` name host files that the session's kernel sees read-only, as
``pathlib.Path`` inputs. :func:`pin_files` resolves each path (``realpath``) and records its
size and modification time in the session's config; :func:`bound_files` binds them, and only
them: a resumed session refuses a file that is gone or changed. The config never holds a
file's content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from sunroom.errors import UsageError
from sunroom.sandbox.inputs import File
from sunroom.service.schemas import CreateSession, FileInputIn

__all__ = ["bound_files", "pin_files"]


def pin_files(request: CreateSession) -> CreateSession:
    """*request* with each file input resolved (``realpath``) and its size and mtime recorded.

    Raises UsageError (one sentence) for a missing path, one that is not a regular file, or a
    name that is also a value input.
    """
    if not request.files:
        return request
    pinned: dict[str, FileInputIn] = {}
    for name, spec in request.files.items():
        if name in request.inputs:
            raise UsageError(f"input {name!r} is given both as a value and as a file")
        path = os.path.realpath(spec.path)
        try:
            info = os.stat(path)
        except OSError as exc:
            raise UsageError(
                f"input {name!r}: {spec.path} cannot be bound: {exc.strerror}"
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"input {name!r}: {spec.path} is not a regular file")
        pinned[name] = FileInputIn(path=path, size=info.st_size, mtime_ns=info.st_mtime_ns)
    return request.model_copy(update={"files": pinned})


def bound_files(files: Mapping[str, FileInputIn]) -> dict[str, File]:
    """The File inputs of a session, checked against what its config recorded.

    Raises UsageError (one sentence) when a file is gone or changed (its size or modification
    time differs): a resumed session binds the file it started with, or nothing.
    """
    out: dict[str, File] = {}
    for name, spec in files.items():
        try:
            info = os.stat(spec.path)
        except OSError as exc:
            raise UsageError(
                f"input {name!r}: {spec.path} is gone ({exc.strerror}); the session was "
                "started with it and binds nothing else"
            ) from None
        recorded = (spec.size, spec.mtime_ns)
        if not stat.S_ISREG(info.st_mode) or recorded != (info.st_size, info.st_mtime_ns):
            raise UsageError(
                f"input {name!r}: {spec.path} changed since the session started (its size or "
                "modification time differs); a resumed session binds only the file it started with"
            )
        out[name] = File(spec.path)
    return out
