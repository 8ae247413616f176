"""Usage errors of the ``sunroom`` commands: one line on stderr, exit 2, in the CLI's terms.

Run through ``typer.testing.CliRunner`` (in process): none of these gets as far as a kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sunroom.cli import app


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stderr


def test_an_input_name_given_twice_is_refused(tmp_path: Path) -> None:
    """Before, the second file silently replaced the first (issue 28, item 9)."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("a")
    b.write_text("b")
    for command in (["exec", "-"], ["run", "task", "--model", "scripted:x.json"]):
        code, err = _invoke(*command, "--input", f"doc={a}", "--input", f"doc={b}")
        assert code == 2, err
        assert err == "sunroom: --input doc is given twice; each NAME binds one file\n"


def test_a_missing_api_key_says_how_to_set_it_here(tmp_path: Path) -> None:
    """Not the Python API's "(or pass api_key=)", which means nothing on a command line."""
    env: dict[str, str | None] = {"ANTHROPIC_API_KEY": None, "SUNROOM_DB": str(tmp_path / "s.db")}
    code, err = _invoke("run", "task", "--model", "anthropic:claude-haiku-4-5", env=env)
    assert code == 2
    assert err == (
        "sunroom: no API key for anthropic: set ANTHROPIC_API_KEY in the environment, or choose "
        "another model with --model or SUNROOM_MODEL (openai-compatible: and scripted: models "
        "need no key)\n"
    )
    assert "api_key=" not in err


@pytest.mark.parametrize(
    ("prefix", "url"),
    [("ollama", "http://127.0.0.1:11434/v1"), ("lmstudio", "http://127.0.0.1:1234/v1")],
)
def test_a_local_server_prefix_gets_the_openai_compatible_hint(
    tmp_path: Path, prefix: str, url: str
) -> None:
    env: dict[str, str | None] = {"SUNROOM_DB": str(tmp_path / "s.db")}
    code, err = _invoke("run", "task", "--model", f"{prefix}:llama3.2:3b", env=env)
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.endswith(
        f"{prefix} serves the OpenAI API: use 'openai-compatible:llama3.2:3b' with the base URL "
        f"{url}\n"
    ), err
