"""Where an embedding model's files are: a local directory, or a Hugging Face repo in the HF cache.

:func:`resolve_model` turns the ``model`` argument of an embedder into a directory that holds an
ONNX graph (``model.onnx`` or ``onnx/model.onnx``) and ``tokenizer.json``:

- an existing local directory is used as it is;
- ``org/name`` or ``org/name@revision`` is looked up in the standard Hugging Face cache layout
  (``<cache>/models--org--name/snapshots/<commit>/...``, ``refs/<branch>`` holding the commit),
  the cache being ``cache_dir``, else ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``; when the snapshot is missing, the files are downloaded from
  ``endpoint`` (else ``$HF_ENDPOINT``, else https://huggingface.co): the listing at
  ``/api/models/{repo}/revision/{rev}``, then each needed file at
  ``/{repo}/resolve/{commit}/{file}``.

Every remote file name is checked before anything is written: an absolute path, ``..``, a
backslash, an empty part or a control character refuses the whole model with
:class:`~sunroom.errors.EmbeddingModelError`, and every target path is checked to resolve inside
the cache. A file is streamed into a temporary file beside its target and renamed into place, so
an interrupted download never leaves a partial file under its real name. Files are written as
plain files in the snapshot directory (the layout huggingface_hub itself uses where it cannot
make symbolic links), which huggingface_hub reads too. ``$HF_TOKEN``, when set, is sent as a
bearer token and never appears in a message.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sunroom.errors import EmbeddingModelError, UsageError

__all__ = [
    "DEFAULT_ENDPOINT",
    "MAX_FILE_BYTES",
    "MAX_LISTING",
    "ONNX_NAMES",
    "WANTED",
    "default_cache",
    "find_onnx",
    "resolve_model",
    "safe_remote_name",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
ONNX_NAMES = ("model.onnx", "onnx/model.onnx")
"""Where the ONNX graph is looked for, in this order."""
MAX_FILE_BYTES = 8 * 1024**3
"""A downloaded file larger than this (8 GiB) is refused and removed."""
MAX_LISTING = 100_000
"""A repo listing with more file names than this is refused."""
WANTED = (
    "tokenizer.json",
    "config.json",
    "modules.json",
    "1_Pooling/config.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
"""The files fetched besides the ONNX graph (each only when the repo lists it)."""
TIMEOUT_S = 60.0
"""Connect/read timeout of one download request, in seconds."""

_REPO_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)(?:@(.+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"^[A-Za-z0-9._/-]+$")


def default_cache() -> Path:
    """The HF hub cache: ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``."""
    if env := os.environ.get("HF_HUB_CACHE"):
        return Path(env).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def safe_remote_name(name: object) -> str:
    """``name`` when it is a safe relative POSIX path, else :class:`EmbeddingModelError`.

    Refused: non-strings, empty names, absolute paths, backslashes, ``..`` or ``.`` or empty
    parts (``a//b``), and control characters (NUL included).
    """
    if not isinstance(name, str) or not name:
        raise EmbeddingModelError("the model listing has an empty or non-text file name")
    bad = (
        name.startswith("/")
        or "\\" in name
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part in ("", ".", "..") for part in name.split("/"))
        or re.match(r"^[A-Za-z]:", name) is not None
    )
    if bad:
        raise EmbeddingModelError(
            f"the model listing names a file outside the model directory ({name!r}); refused"
        )
    return name


def find_onnx(directory: Path) -> Path | None:
    """The ONNX graph in ``directory`` (``model.onnx``, then ``onnx/model.onnx``), or None."""
    for name in ONNX_NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


def resolve_model(
    model: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
) -> Path:
    """The directory holding ``model``'s files, downloading them into the HF cache if needed.

    Raises :class:`UsageError` for a ``model`` that is neither an existing directory nor a
    repo id, and :class:`EmbeddingModelError` when the files cannot be fetched or a remote file
    name is unsafe (nothing is written then).
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = os.fspath(model)
    match = _REPO_ID.match(text)
    if match is None or ".." in (match.group(1), match.group(2)):
        raise UsageError(
            f"model {text!r} is neither a local directory nor a Hugging Face repo id "
            "('org/name' or 'org/name@revision')"
        )
    org, name, revision = match.group(1), match.group(2), match.group(3) or "main"
    if any(part in ("", ".", "..") for part in revision.split("/")) or not _REVISION.match(
        revision
    ):
        # a branch name becomes a path under refs/: only plain relative names
        raise UsageError(f"revision {revision!r} of {org}/{name} is not a branch, tag or commit")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache()
    repo_dir = cache / f"models--{org}--{name}"
    snapshot = _cached_snapshot(repo_dir, revision)
    if snapshot is not None:
        return snapshot
    url = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return _download(f"{org}/{name}", revision, url.rstrip("/"), cache, repo_dir)


def _cached_snapshot(repo_dir: Path, revision: str) -> Path | None:
    commit = revision if _COMMIT.match(revision) else None
    ref = repo_dir / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    if commit is None or not _COMMIT.match(commit):
        return None
    snapshot = repo_dir / "snapshots" / commit
    if find_onnx(snapshot) is not None and (snapshot / "tokenizer.json").is_file():
        return snapshot
    return None


def _inside(root: Path, target: Path) -> Path:
    """``target`` when it resolves inside ``root``; else EmbeddingModelError (nothing written)."""
    resolved = target.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise EmbeddingModelError("a model file would be written outside the cache; refused")
    return resolved


def _pick(names: Iterable[str]) -> list[str]:
    listed = set(names)
    onnx = next((n for n in ONNX_NAMES if n in listed), None)
    if onnx is None:
        raise EmbeddingModelError(
            "the model repo has no ONNX graph (looked for model.onnx and onnx/model.onnx)"
        )
    if "tokenizer.json" not in listed:
        raise EmbeddingModelError("the model repo has no tokenizer.json")
    extra = [n for n in (f"{onnx}_data", f"{onnx}.data") if n in listed]  # external weights
    return [onnx, *extra, *(n for n in WANTED if n in listed)]


def _download(repo: str, revision: str, endpoint: str, cache: Path, repo_dir: Path) -> Path:
    import httpx

    headers = {"user-agent": "sunroom"}
    if token := os.environ.get("HF_TOKEN"):
        headers["authorization"] = f"Bearer {token}"
    try:
        with httpx.Client(
            base_url=endpoint, headers=headers, follow_redirects=True, timeout=TIMEOUT_S
        ) as client:
            listing = _listing(client, repo, revision)
            commit = listing.get("sha")
            if not isinstance(commit, str) or not _COMMIT.match(commit):
                raise EmbeddingModelError(
                    f"the listing of {repo}@{revision} has no commit id; refused"
                )
            siblings = listing.get("siblings")
            if not isinstance(siblings, list) or len(siblings) > MAX_LISTING:
                raise EmbeddingModelError(f"the listing of {repo}@{revision} is malformed")
            # every name is checked before anything is written
            names = [
                safe_remote_name(s.get("rfilename") if isinstance(s, dict) else s) for s in siblings
            ]
            wanted = _pick(names)
            cache.mkdir(parents=True, exist_ok=True)
            snapshot = repo_dir / "snapshots" / commit
            targets = [(n, _inside(cache, snapshot / n)) for n in wanted]
            for remote, target in targets:
                _fetch(client, f"/{repo}/resolve/{commit}/{remote}", target, remote)
    except httpx.HTTPError as exc:
        raise EmbeddingModelError(
            f"could not download {repo}@{revision} from {endpoint}: {type(exc).__name__}"
        ) from exc
    if not _COMMIT.match(revision):
        ref = _inside(cache, repo_dir / "refs" / revision)
        ref.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(ref, commit.encode())
    return snapshot


def _listing(client: Any, repo: str, revision: str) -> dict[str, Any]:
    response = client.get(f"/api/models/{repo}/revision/{revision}")
    if response.status_code != 200:
        raise EmbeddingModelError(
            f"the endpoint answered {response.status_code} for the listing of {repo}@{revision}"
        )
    try:
        body = response.json()
    except json.JSONDecodeError as exc:
        raise EmbeddingModelError(f"the listing of {repo}@{revision} is not JSON") from exc
    if not isinstance(body, dict):
        raise EmbeddingModelError(f"the listing of {repo}@{revision} is malformed")
    return body


def _fetch(client: Any, url: str, target: Path, remote: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".incomplete", dir=target.parent
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, client.stream("GET", url) as response:
            if response.status_code != 200:
                raise EmbeddingModelError(
                    f"the endpoint answered {response.status_code} for {remote}"
                )
            size = 0
            for chunk in response.iter_bytes(1 << 20):
                size += len(chunk)
                if size > MAX_FILE_BYTES:
                    raise EmbeddingModelError(
                        f"{remote} is larger than the {MAX_FILE_BYTES} byte limit; refused"
                    )
                out.write(chunk)
        tmp.chmod(0o644)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write(target: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp_name, target)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
