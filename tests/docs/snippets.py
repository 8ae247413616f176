"""The fenced code blocks of README.md and docs/*.md, their markers, and how each one runs.

A block is one fenced ``python``, ``bash`` or ``sh`` block. The line right before its opening
fence may hold one marker (docs/testing.md, "Doc snippets"):

- ``<!-- snippet: skip (REASON) -->``: not run, for REASON (required);
- ``<!-- snippet: continues -->``: a python block that runs in the same process and namespace
  as the previous python block of the same file (which runs first);
- ``<!-- snippet: setup NAME -->``: run with the fixture NAME of :data:`FIXTURES`.

Every other block runs as written, from the repository root, with ``$HOME`` a fresh scratch
directory and no API key in its environment. Python blocks run in the checkout's Python; a
block with a top-level ``await`` runs on an event loop (as in ``python -m asyncio``). Bash and
sh blocks run with ``bash -euo pipefail`` and ``.venv/bin`` first on ``PATH``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
LANGUAGES: Final = ("python", "bash", "sh")
INSIDE: Final = "SUNROOM_DOC_SNIPPET"
"""Set in every block's environment: a block that runs the test suite (``bash scripts/test.sh``)
does not run the doc snippets again inside itself."""
TIMEOUT_S: Final = 90.0
"""How long one block (with the blocks it continues) may run."""

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
_ANY_MARKER = re.compile(r"^\s*<!--\s*snippet\b")
_SKIP = re.compile(r"^skip\s*\((?P<reason>.*)\)$")
_SETUP = re.compile(r"^setup\s+(?P<name>[\w-]+)$")
_SECRET_VARS = re.compile(r".*(_API_KEY|_TOKEN|_SECRET)$|^SUNROOM_(MODEL|BASE_URL|DB|BACKEND)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and code, and what its marker says.

    Attributes:
        path: the file, relative to the repository root (``docs/agent.md``).
        line: the line of the opening fence (1-based).
        language: ``python``, ``bash`` or ``sh``.
        code: the block's text, the fence's indentation removed.
        skip: the reason of a ``skip`` marker, else None.
        continues: the block continues the previous python block of its file.
        setup: the fixture a ``setup`` marker names, else None.
        problem: what is wrong with the marker (one sentence), else None.
    """

    path: str
    line: int
    language: str
    code: str
    skip: str | None = None
    continues: bool = False
    setup: str | None = None
    problem: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _marker(block: Block, text: str) -> Block:
    """*block* with the marker *text* (the comment's body) applied, or its problem."""
    body = " ".join(text.split())
    if (skip := _SKIP.match(body)) is not None:
        reason = skip["reason"].strip()
        if not reason:
            return _with(block, problem="its skip marker gives no reason: write skip (WHY)")
        return _with(block, skip=reason)
    if body == "skip":
        return _with(block, problem="its skip marker gives no reason: write skip (WHY)")
    if body == "continues":
        if block.language != "python":
            return _with(block, problem="only python blocks can continue a previous block")
        return _with(block, continues=True)
    if (setup := _SETUP.match(body)) is not None:
        if setup["name"] not in FIXTURES:
            return _with(
                block,
                problem=f"its marker names the unknown fixture {setup['name']!r} "
                f"(known: {', '.join(sorted(FIXTURES))})",
            )
        return _with(block, setup=setup["name"])
    return _with(
        block,
        problem=f"its marker {body!r} is none of: skip (REASON), continues, setup NAME",
    )


def _with(block: Block, **changes: object) -> Block:
    return dataclasses.replace(block, **changes)  # type: ignore[arg-type]


def blocks_of(path: str, text: str) -> list[Block]:
    """The python, bash and sh blocks of markdown *text* (from file *path*), markers applied.

    A line starting ``<!-- snippet`` outside a fence that is not right before such a block is
    returned as a block with a problem (a marker that marks nothing is a mistake, not a
    comment); one quoted in the text (in backticks) is not a marker.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    marked: set[int] = set()
    fenced: set[int] = set()  # lines inside any fence: a marker shown there is an example
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = (opening["info"].split() or [""])[0]
        end = i + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            end += 1
        fenced.update(range(i, end + 1))
        if language in LANGUAGES:
            code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            block = Block(path=path, line=i + 1, language=language, code=code)
            if i > 0 and (marker := _MARKER.match(lines[i - 1])) is not None:
                block = _marker(block, marker["body"])
                marked.add(i - 1)
            blocks.append(block)
        i = end + 1
    for n, line in enumerate(lines):
        if n not in marked and n not in fenced and _ANY_MARKER.match(line):
            blocks.append(
                Block(
                    path=path,
                    line=n + 1,
                    language="marker",
                    code=line,
                    problem="this snippet marker is not on the line right before a "
                    "python, bash or sh fence, so it marks nothing",
                )
            )
    return sorted(blocks, key=lambda b: b.line)


def documented_blocks() -> list[Block]:
    """Every block of README.md and docs/*.md, in file and line order."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [b for f in files for b in blocks_of(str(f.relative_to(ROOT)), f.read_text())]


def chain(block: Block, blocks: list[Block]) -> list[Block]:
    """The python blocks that run in *block*'s process, in order, *block* last.

    Raises ValueError (one sentence) when *block* continues nothing, or continues a block
    that is skipped.
    """
    if not block.continues:
        return [block]
    earlier = [
        b for b in blocks if b.path == block.path and b.language == "python" and b.line < block.line
    ]
    if not earlier:
        raise ValueError(f"{block.id} is marked continues but no python block comes before it")
    previous = earlier[-1]
    if previous.skip is not None:
        raise ValueError(
            f"{block.id} continues {previous.id}, which is skipped: skip it too, with the reason"
        )
    return [*chain(previous, blocks), block]


def backends(block: Block) -> tuple[str, ...]:
    """The kernel backends *block* needs: ``bwrap`` (the default) always, ``docker`` and
    ``jupyter`` when its code names them."""
    code = block.code
    named = [("docker", ('backend="docker"', "DockerBackend")), ("jupyter", ("JupyterBackend",))]
    return ("bwrap", *(name for name, marks in named if any(m in code for m in marks)))


# -- fixtures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What a fixture makes of a block before it runs: its code, and Python run before it."""

    code: str
    prelude: str = ""


def _free_port(block: Block) -> Prepared:
    """The service's default port 8765 becomes a free loopback port: in the block's URLs, and
    as ``--port`` of the ``sunroom serve`` it starts (parallel runs never share a port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = block.code.replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    return Prepared(re.sub(r"\bsunroom serve\b", f"sunroom serve --port {port}", code))


TEST_MODEL_PATH: Final = ".venv/sunroom-test-models/all-MiniLM-L6-v2-onnx"


def _test_model(block: Block) -> Prepared:
    """The embedding test model's default path becomes its actual directory (built by
    tests/embeddings/testmodel.py from what scripts/test-models.sh fetched; $SUNROOM_TEST_MODELS
    may move it)."""
    from tests.embeddings import testmodel

    return Prepared(block.code.replace(TEST_MODEL_PATH, str(testmodel.model_dir())))


def _test_wheels(block: Block) -> Prepared:
    """The test wheels' default directory becomes their actual one ($SUNROOM_TEST_WHEELS may
    move it; scripts/test-wheels.sh fetches them)."""
    from tests.packages.wheels import real_wheelhouse

    return Prepared(block.code.replace(".venv/sunroom-test-wheels", str(real_wheelhouse())))


PLACEHOLDERS: Final = """\
import io, os, pathlib
os.chdir(os.path.expanduser("~"))
pathlib.Path("data/corpus").mkdir(parents=True, exist_ok=True)
pathlib.Path("data/sales.csv").write_text("region,revenue\\nnorth,120.5\\nsouth,340.0\\n")
for _n in range(3):
    pathlib.Path(f"data/corpus/doc{_n}.txt").write_text(f"document {_n}\\n")
huge_str = "x" * 10_000_000
list_of_documents = [f"document {_n}" for _n in range(1_000)]
csv_bytes = b"region,revenue\\nnorth,120.5\\nsouth,340.0\\n"
sink = io.BytesIO()
import sunroom
limits = sunroom.Limits(timeout_s=5, memory_mb=512)
def lookup(ticker: str) -> float:
    \"\"\"Latest price of a ticker.\"\"\"
    return 231.5
"""


def _placeholders(block: Block) -> Prepared:
    """The names docs use for the reader's own things are defined first, and the block runs in
    its scratch directory: ``data/sales.csv``, ``data/corpus/``, ``huge_str``,
    ``list_of_documents``, ``csv_bytes``, ``sink`` (a ``BytesIO``), ``limits``, ``lookup``."""
    return Prepared(block.code, PLACEHOLDERS)


FIXTURES: Final[dict[str, Callable[[Block], Prepared]]] = {
    "free-port": _free_port,
    "test-model": _test_model,
    "test-wheels": _test_wheels,
    "placeholders": _placeholders,
}
"""``setup NAME`` fixtures: each turns a block into what runs (docs/testing.md lists them)."""


# -- running ---------------------------------------------------------------------------------

_DRIVER = """\
import ast, asyncio, inspect, json, sys
todo = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
loop = asyncio.new_event_loop()
for item in todo:
    # the file's own line numbers, so a traceback points into the markdown file
    source = "\\n" * item["line"] + item["code"]
    code = compile(source, item["path"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        loop.run_until_complete(eval(code, namespace))
    else:
        exec(code, namespace)
loop.run_until_complete(loop.shutdown_asyncgens())
loop.close()
"""


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its exit code (None: timed out and killed) and its output."""

    returncode: int | None
    stdout: str
    stderr: str

    def failure(self, block: Block) -> str | None:
        """Why the run of *block* failed, for a person (the output's tail), or None."""
        if self.returncode == 0:
            return None
        how = (
            f"did not end within {TIMEOUT_S:g} s and was killed (a command that runs until "
            "stopped? mark it skip with the reason)"
            if self.returncode is None
            else f"exited {self.returncode}"
        )
        return (
            f"{block.id} ({block.language}) {how}\n"
            f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}"
        )


def environment(home: Path) -> dict[str, str]:
    """A user's environment with the checkout's venv active and no key: ``$HOME`` is *home*,
    ``.venv/bin`` leads ``PATH``, the checkout is importable, API keys and tokens are gone."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not _SECRET_VARS.match(k) and not k.startswith(("XDG_", "PYTEST_"))
    }
    env["HOME"] = str(home)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # this checkout's sunroom, also for .venv/bin/sunroom
    env["VIRTUAL_ENV"] = str(ROOT / ".venv")
    env[INSIDE] = "1"
    return env


def run(block: Block, blocks: list[Block]) -> Outcome:
    """Run *block* (after the blocks it continues) as docs/testing.md says; never raises for
    the block's own failure."""
    with tempfile.TemporaryDirectory(prefix="snippet-") as scratch:
        home = Path(scratch)
        home.chmod(0o755)  # a home as usual: kernels (another uid) may read files bound from it
        if block.language == "python":
            todo = []
            for b in chain(block, blocks):
                prepared = FIXTURES[b.setup](b) if b.setup else Prepared(b.code)
                if prepared.prelude:
                    todo.append({"path": f"<setup {b.setup}>", "line": 0, "code": prepared.prelude})
                todo.append({"path": b.path, "line": b.line, "code": prepared.code})
            plan = home / ".snippet.json"
            plan.write_text(json.dumps(todo))
            argv = [str(ROOT / ".venv" / "bin" / "python"), "-c", _DRIVER, str(plan)]
        else:
            prepared = FIXTURES[block.setup](block) if block.setup else Prepared(block.code)
            argv = ["bash", "-euo", "pipefail", "-c", prepared.code]
        return _run(argv, environment(home), home)


def _run(argv: list[str], env: dict[str, str], scratch: Path) -> Outcome:
    """Run *argv* from the repository root in a session of its own; whatever it leaves in that
    session (a server started with ``&``) is killed when it ends or times out. Its output goes
    to files in *scratch*, so a process left holding it cannot keep the run waiting."""
    with (
        (scratch / ".stdout").open("w+", errors="replace") as out,
        (scratch / ".stderr").open("w+", errors="replace") as err,
    ):
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_session(process.pid)
            process.wait()
        out.seek(0)
        err.seek(0)
        return Outcome(code, out.read(), err.read())


def _kill_session(pid: int) -> None:
    """SIGKILL every process left in the session (and process group) *pid* leads."""
    with contextlib.suppress(ProcessLookupError):  # the session is empty: nothing was left
        os.killpg(pid, signal.SIGKILL)


__all__ = [
    "FIXTURES",
    "INSIDE",
    "LANGUAGES",
    "ROOT",
    "TIMEOUT_S",
    "Block",
    "Outcome",
    "backends",
    "blocks_of",
    "chain",
    "documented_blocks",
    "environment",
    "run",
]

if __name__ == "__main__":  # list the blocks and their markers
    for b in documented_blocks():
        print(b.id, b.language, b.skip or b.setup or ("continues" if b.continues else b.problem))
    sys.exit(0)
