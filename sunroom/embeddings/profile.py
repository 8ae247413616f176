"""How a model turns token states into sentence vectors: pooling, normalisation, prefixes, length.

Read from the model directory's sentence-transformers files when present (``modules.json``,
``1_Pooling/config.json`` or the pooling module's path, ``sentence_bert_config.json``,
``config_sentence_transformers.json``'s ``prompts``), otherwise from per-family defaults keyed on
the model's name:

===========  ======================================================  ==========  =========
family       query / document prefix                                 pooling     normalise
===========  ======================================================  ==========  =========
e5           ``"query: "`` / ``"passage: "``                         mean        yes
nomic        ``"search_query: "`` / ``"search_document: "``          mean        yes
bge          ``"Represent this sentence for searching relevant       cls         yes
             passages: "`` / none (the English models' instruction)
other        none / none                                             mean        yes
===========  ======================================================  ==========  =========

The files win over the family table, and explicit arguments win over both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sunroom.errors import EmbeddingModelError

__all__ = ["Pooling", "Profile", "read_profile"]

Pooling = Literal["mean", "cls", "max", "lasttoken"]

BGE_QUERY = "Represent this sentence for searching relevant passages: "
_FAMILIES: tuple[tuple[str, str | None, str | None, Pooling], ...] = (
    ("e5", "query: ", "passage: ", "mean"),
    ("nomic", "search_query: ", "search_document: ", "mean"),
    ("bge", BGE_QUERY, None, "cls"),
)


@dataclass(frozen=True, slots=True)
class Profile:
    """A model's pooling, normalisation, default prefixes and length limits."""

    pooling: Pooling
    normalize: bool
    query_prefix: str | None
    document_prefix: str | None
    max_length: int | None
    """The length the model was trained for (sentence_bert_config.json), if said."""
    max_positions: int | None
    """The position table's size (config.json's max_position_embeddings), if said."""
    hidden_size: int | None
    vocab_size: int | None


def _json(path: Path) -> object:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbeddingModelError(f"{path.name} in the model directory is not valid JSON") from exc


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _pooling_from(config: object) -> Pooling | None:
    if not isinstance(config, dict):
        return None
    modes: tuple[tuple[str, Pooling], ...] = (
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_lasttoken", "lasttoken"),
    )
    for key, mode in modes:
        if config.get(key) is True:
            return mode
    return None


def read_profile(directory: Path, name: str) -> Profile:
    """The profile of the model in ``directory``; ``name`` picks the family defaults."""
    words = set(re.split(r"[/\\\s_.@-]+", f"{name} {directory.name}".lower()))
    family = next((f for f in _FAMILIES if f[0] in words), None)
    query, document, pooling = (family[1], family[2], family[3]) if family else (None, None, "mean")
    normalize = True
    modules = _json(directory / "modules.json")
    pooling_dir = "1_Pooling"
    if isinstance(modules, list):
        types = [m.get("type", "") for m in modules if isinstance(m, dict)]
        normalize = any(str(t).endswith(".Normalize") for t in types)
        for m in modules:
            if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling"):
                pooling_dir = str(m.get("path") or pooling_dir)
    # a module path from the file: only a plain child directory is read
    if "/" in pooling_dir or "\\" in pooling_dir or pooling_dir in ("", ".", ".."):
        pooling_dir = "1_Pooling"
    pooling = _pooling_from(_json(directory / pooling_dir / "config.json")) or pooling
    st_config = _json(directory / "config_sentence_transformers.json")
    prompts = st_config.get("prompts") if isinstance(st_config, dict) else None
    if isinstance(prompts, dict):
        if isinstance(prompts.get("query"), str):
            query = prompts["query"] or None
        for key in ("document", "passage"):
            if isinstance(prompts.get(key), str):
                document = prompts[key] or None
                break
    sbert = _json(directory / "sentence_bert_config.json")
    config = _json(directory / "config.json")
    config = config if isinstance(config, dict) else {}
    return Profile(
        pooling=pooling,
        normalize=normalize,
        query_prefix=query,
        document_prefix=document,
        max_length=_int(sbert.get("max_seq_length")) if isinstance(sbert, dict) else None,
        max_positions=_int(config.get("max_position_embeddings")),
        hidden_size=_int(config.get("hidden_size") or config.get("d_model")),
        vocab_size=_int(config.get("vocab_size")),
    )
