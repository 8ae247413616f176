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
"""

from __future__ import annotations

import json
from typing import Annotated, Final, Literal

import typer

from sunroom.cli.support import JsonOption, fail, one_line, read_text
from sunroom.errors import SunroomError

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


def embed_command(
    file: Annotated[str, typer.Argument(help="One text per line (- for stdin).")],
    model: Annotated[
        str,
        typer.Option(help="A model directory, or a Hugging Face repo id (cached once fetched)."),
    ],
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

    Exit status: 0 done, 2 a usage, input or model error (one line on stderr).
    """
    if kind not in ("document", "query"):
        raise fail(f"--kind must be document or query, got {kind!r}")
    if k < 1:
        raise fail(f"--k must be at least 1, got {k}")
    lines = _lines(file)
    texts = [t for _, t in lines]
    text_kind: Literal["document", "query"] = "query" if kind == "query" else "document"
    try:
        from sunroom.embeddings import OnnxEmbedder
        from sunroom.embeddings.functions import rank
    except ModuleNotFoundError as exc:
        raise fail(
            f"sunroom embed needs the embeddings extra ({exc.name} is missing): "
            "pip install 'sunroom[embeddings]'"
        ) from None
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
