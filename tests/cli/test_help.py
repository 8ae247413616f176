"""``--help`` shows the help texts as written, with labels that read well (issue 28, item 7).

Before: rich markup ate ``[y]es / [n]o / [a]lways`` (shown as ``es / o / lways``) and
``[default: python3]``; reST double backticks were shown raw; options were labelled by their
Python types (``<str>``, ``<list[str]>``, ``<bool>``). And ``sunroom mcp`` started in a terminal
printed nothing at all while it waited for a client on stdin.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sunroom.cli import app

COMMANDS = [
    [], ["exec"], ["run"], ["serve"], ["mcp"], ["embed"], ["kernelspecs"], ["sessions"],
    ["sessions", "list"], ["sessions", "show"], ["sessions", "export"], ["sessions", "resume"],
    ["sessions", "purge"],
]  # fmt: skip


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_run_help_shows_the_approval_prompt_and_defaults_as_written() -> None:
    text = _help("run")
    assert "[y]es / [n]o / [a]lways this run" in text
    assert "[default: python3]" in text and "[default: bwrap]" in text
    assert "NAME=FILE" in text and "NAME=POLICY" in text and "MODULE:ATTR" in text


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "sunroom")
def test_help_has_no_rest_markup_and_no_python_type_labels(command: list[str]) -> None:
    text = _help(*command)
    assert not re.search(r"(?<!`)``(?!`)", text), text  # ```python (a code fence) is meant
    for label in ("<str>", "<list[str]>", "<bool>", "<int>", "<float>", "<path>"):
        assert label not in text, f"{label} in {' '.join(command)} --help"


@pytest.mark.kernel  # a process of its own: stdin must be a terminal
def test_mcp_in_a_terminal_says_it_waits_for_a_client_and_is_silent_on_a_pipe() -> None:
    argv = [sys.executable, "-m", "sunroom.cli", "mcp", "--backend", "subprocess"]
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(argv, stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(terminal)
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        assert ready, "nothing on stderr within 60 s"
        line = proc.stderr.readline().decode()
    finally:
        proc.kill()
        proc.communicate()
        os.close(controller)
    assert line == (
        "sunroom mcp: waiting for an MCP client on stdin (an MCP client starts this command "
        'itself: see "Client configuration" in docs/mcp.md, or use --http); Ctrl-C stops\n'
    )
    piped = subprocess.run(argv, input=b"", capture_output=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == b"" and piped.stdout == b""


def test_help_paragraphs_are_reflowed_for_the_terminal() -> None:
    """A docstring's source line breaks (at 100 columns) do not land mid-sentence in a
    terminal's help; list items and indented lines keep theirs."""
    from sunroom.cli.helptext import reflow

    text = "One sentence\nthat goes on.\n\n- a list item\n- another\n\n    indented\n    code"
    assert reflow(text) == (
        "One sentence that goes on.\n\n- a list item\n- another\n\n    indented\n    code"
    )
