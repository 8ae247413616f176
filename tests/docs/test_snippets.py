"""Every python, bash and sh block of README.md and docs/*.md runs as written, or says why not.

One test per block (``docs/agent.md:120``): it runs the block (tests/docs/snippets.py says
how) and fails with the file, the line and the output's tail when the block fails; a block
marked ``skip (REASON)`` is skipped with its reason; a marker that is unknown, gives no reason
or marks nothing fails. The convention is in docs/testing.md, "Doc snippets".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import _require
from tests.docs import snippets
from tests.docs.snippets import Block, blocks_of, chain

BLOCKS = snippets.documented_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_a_doc_snippet_runs_as_written(block: Block) -> None:
    if block.problem is not None:
        pytest.fail(f"{block.id}: {block.problem}", pytrace=False)
    if block.skip is not None:
        pytest.skip(block.skip)
    if os.environ.get(snippets.INSIDE):
        pytest.skip("this run is inside a doc snippet (one that runs the tests): no recursion")
    try:
        blocks = chain(block, BLOCKS)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    for backend in dict.fromkeys(name for b in blocks for name in snippets.backends(b)):
        _require(backend)  # skipped, saying why, where it cannot start and is not required
    failure = snippets.run(block, BLOCKS).failure(block)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


# -- the convention itself (no process) --------------------------------------------------------

DOC = """\
# A guide

<!-- snippet: skip (needs an Anthropic API key) -->
```python
import anthropic_only
```

```bash
echo hi
```

<!-- snippet: continues -->
```python
x = 1
```

<!-- snippet: skip -->
```sh
true
```

<!-- snippet: skip () -->
```python
pass
```

<!-- snippet: sometimes -->
```python
pass
```

<!-- snippet: setup nowhere -->
```bash
true
```

<!-- snippet: setup free-port -->
```bash
sunroom serve &
curl http://127.0.0.1:8765/healthz
```

<!-- snippet: continues -->

```python
pass
```

- a list item:

  ```python
  indented = True
  ```

```json
{"not": "a snippet"}
```

Quoted, `<!-- snippet: skip -->` is no marker.

```markdown
<!-- snippet: skip -->
```
"""


def test_blocks_are_found_with_their_lines_and_markers() -> None:
    found = {b.line: b for b in blocks_of("docs/guide.md", DOC)}
    assert [b.language for b in found.values()] == [
        "python", "bash", "python", "sh", "python", "python", "bash", "bash", "marker",
        "python", "python",
    ]  # fmt: skip
    assert found[4].skip == "needs an Anthropic API key" and found[4].id == "docs/guide.md:4"
    assert found[4].code == "import anthropic_only\n"
    assert found[8].problem is None and found[8].skip is None and not found[8].continues
    assert found[13].continues
    assert found[38].setup == "free-port"
    assert found[51].code == "indented = True\n"


def test_a_bad_marker_is_a_problem_naming_what_is_wrong() -> None:
    found = {b.line: b for b in blocks_of("docs/guide.md", DOC)}
    assert "no reason" in str(found[18].problem)
    assert "no reason" in str(found[23].problem)
    assert "'sometimes' is none of" in str(found[28].problem)
    assert "unknown fixture 'nowhere'" in str(found[33].problem)
    assert "marks nothing" in str(found[43].problem)
    assert found[45].problem is None and not found[45].continues  # its marker was not right before


def test_a_continued_block_runs_after_the_blocks_it_continues() -> None:
    doc = "```python\na = 1\n```\n<!-- snippet: continues -->\n```python\nb = a\n```\n"
    doc += "<!-- snippet: continues -->\n```python\nc = b\n```\n"
    blocks = blocks_of("g.md", doc)
    assert [b.line for b in chain(blocks[2], blocks)] == [1, 5, 9]
    first = blocks_of("g.md", "<!-- snippet: continues -->\n```python\nb = a\n```\n")
    with pytest.raises(ValueError, match="no python block comes before it"):
        chain(first[0], first)
    skipped = blocks_of(
        "g.md",
        "<!-- snippet: skip (needs a key) -->\n```python\na = 1\n```\n"
        "<!-- snippet: continues -->\n```python\nb = a\n```\n",
    )
    with pytest.raises(ValueError, match="which is skipped"):
        chain(skipped[1], skipped)


def test_the_free_port_fixture_moves_the_service_off_8765() -> None:
    block = next(b for b in blocks_of("docs/guide.md", DOC) if b.setup == "free-port")
    code = snippets.FIXTURES["free-port"](block).code
    assert "8765" not in code
    port = code.split("--port ")[1].split()[0]
    assert f"sunroom serve --port {port} &" in code and f"127.0.0.1:{port}/healthz" in code


def test_the_environment_holds_no_key_and_puts_the_venv_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("SUNROOM_TOKEN", "secret")
    monkeypatch.setenv("SUNROOM_MODEL", "anthropic:claude-haiku-4-5")
    env = snippets.environment(tmp_path)
    assert not {"ANTHROPIC_API_KEY", "SUNROOM_TOKEN", "SUNROOM_MODEL"} & set(env)
    assert env["HOME"] == str(tmp_path)
    assert env["PATH"].startswith(str(snippets.ROOT / ".venv" / "bin"))


def test_every_marker_in_readme_and_docs_is_well_formed() -> None:
    """The markers' mistakes, found without running anything (the fast lane sees them too)."""
    wrong = [f"{b.id}: {b.problem}" for b in BLOCKS if b.problem is not None]
    for block in BLOCKS:
        try:
            chain(block, BLOCKS)
        except ValueError as exc:
            wrong.append(str(exc))
    assert not wrong, "\n".join(wrong)


def test_a_block_needs_bwrap_and_the_backends_its_code_names() -> None:
    def needs(code: str) -> tuple[str, ...]:
        return snippets.backends(Block(path="g.md", line=1, language="python", code=code))

    assert needs("Kernel()") == ("bwrap",)
    assert needs('AsyncKernel(backend="docker")') == ("bwrap", "docker")
    assert needs('JupyterBackend("python3")') == ("bwrap", "jupyter")


# -- the runner (processes, no kernel) ---------------------------------------------------------


@pytest.mark.usefixtures("no_process_left")
def test_a_failing_block_names_its_file_and_line_and_its_traceback_points_there() -> None:
    blocks = blocks_of(
        "docs/guide.md", "# Guide\n\n```python\nx = 1\nraise ValueError('rotted')\n```\n"
    )
    outcome = snippets.run(blocks[0], blocks)
    failure = str(outcome.failure(blocks[0]))
    assert failure.startswith("docs/guide.md:3 (python) exited 1")
    assert 'File "docs/guide.md", line 5' in failure and "ValueError: rotted" in failure


@pytest.mark.usefixtures("no_process_left")
def test_continued_blocks_share_a_namespace_and_top_level_await_runs() -> None:
    doc = "```python\nimport asyncio\nx = 20\n```\n<!-- snippet: continues -->\n"
    doc += "```python\nawait asyncio.sleep(0)\nprint(x + 1)\n```\n"
    blocks = blocks_of("g.md", doc)
    outcome = snippets.run(blocks[1], blocks)
    assert outcome.failure(blocks[1]) is None and outcome.stdout == "21\n"


@pytest.mark.usefixtures("no_process_left")
def test_what_a_bash_block_leaves_running_is_killed() -> None:
    blocks = blocks_of("g.md", "```bash\nsleep 1000 &\necho started\n```\n")
    outcome = snippets.run(blocks[0], blocks)
    assert outcome.returncode == 0 and outcome.stdout == "started\n"


@pytest.mark.usefixtures("no_process_left")
def test_a_block_that_does_not_end_is_killed_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snippets, "TIMEOUT_S", 1.0)
    blocks = blocks_of("g.md", "```sh\nsleep 1000 &\nsleep 1000\n```\n")
    outcome = snippets.run(blocks[0], blocks)
    assert outcome.returncode is None
    assert "did not end within 1 s and was killed" in str(outcome.failure(blocks[0]))
