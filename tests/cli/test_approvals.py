"""``sunroom run --approval NAME=ask``: y/n on a terminal (a real pty), or ``--auto-deny``."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from sunroom.cli.approvals import NO_TTY_REASON, parse_rules

CHARGE = "try:\n    print(charge(amount=5))\nexcept PermissionError as e:\n    print('refused:', e)"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "script.json").write_text(json.dumps({"replies": [{"code": CHARGE}, "done"]}))
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SUNROOM_MODEL", "SUNROOM_BASE_URL", "SUNROOM_TOKEN")
    }
    out.update(
        SUNROOM_MODEL=f"scripted:{tmp_path / 'script.json'}",
        SUNROOM_DB=str(tmp_path / "s.db"),
        SUNROOM_FUNCTIONS="tests.service.hostfns:charge",
        SUNROOM_TEST_LEDGER=str(tmp_path / "ledger.txt"),
        COLUMNS="120",
    )
    return out


ARGS = ["run", "charge it", "--backend", "subprocess", "--approval", "char*=ask"]


def test_without_a_terminal_auto_deny_denies_at_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *ARGS, "--auto-deny"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=_env(tmp_path), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "? approval needed charge(amount=5)" in proc.stdout
    assert f"✗ denied charge() {NO_TTY_REASON}" in proc.stdout
    assert "refused: charge() was not approved" in proc.stdout
    assert not (tmp_path / "ledger.txt").exists()


@pytest.mark.parametrize(("answer", "charged"), [("y", True), ("n", False)])
def test_a_terminal_is_asked_y_or_n(tmp_path: Path, answer: str, charged: bool) -> None:
    leader, follower = pty.openpty()
    try:
        os.write(leader, f"{answer}\n".encode())  # typed ahead: read when the question comes
        proc = subprocess.run(
            [sys.executable, "-m", "sunroom.cli", *ARGS],
            stdin=follower, capture_output=True, text=True, env=_env(tmp_path), timeout=60,
        )  # fmt: skip
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "approve charge(amount=5)? [y]es / [n]o / [a]lways this run" in proc.stdout
    if charged:
        assert "✓ approved charge()" in proc.stdout and "charged 5" in proc.stdout
        assert len((tmp_path / "ledger.txt").read_text().splitlines()) == 1
    else:
        assert "✗ denied charge() denied at the terminal" in proc.stdout
        assert not (tmp_path / "ledger.txt").exists()


def test_approval_rules_are_checked() -> None:
    assert parse_rules(["github.*=ask", "a=b=deny"], ValueError) == {
        "github.*": "ask",
        "a=b": "deny",
    }
    with pytest.raises(ValueError, match="NAME=allow"):
        parse_rules(["github.*=maybe"], ValueError)
