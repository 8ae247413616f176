"""docs/packages.md's snippet runs as written (with the test wheels where they really are)."""

from __future__ import annotations

import re

from tests.packages.wheels import ROOT, real_wheelhouse
from tests.test_readme import _runs_as_written


def test_the_guide_snippet_runs_as_written() -> None:
    text = (ROOT / "docs" / "packages.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", text, re.S)
    snippet = snippet.replace(".venv/sunroom-test-wheels", str(real_wheelhouse()))
    _runs_as_written(snippet, "[InstalledPackage(name='toolz', version='1.0.0', site=True)]")
