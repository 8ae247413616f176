"""``sunroom exec --allow-host / --network FILE`` and ``serve --network``: real CLI processes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _require
from tests.network.origin import serving

CANARY = "CLICANARY" + "9f8e7d6c5b4a39281706f5e4d3c2b1a0"


@pytest.fixture
def port() -> Iterator[int]:
    with serving(lambda _, h: b"keyed" if h.get("X-Key") == CANARY else b"plain") as port:
        yield port


def sunroom(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def fetch(host: str, port: int) -> str:
    return (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    out = urllib.request.urlopen('http://{host}:{port}/', timeout=20).read().decode()\n"
        "except urllib.error.HTTPError as e:\n"
        "    out = e.code\n"
        "out"
    )


def test_exec_with_a_policy_file_and_allow_host(tmp_path: Path, port: int) -> None:
    _require("bwrap")
    policy = tmp_path / "net.json"
    policy.write_text(
        json.dumps(
            {
                "allow": [f"api.test:{port}"],
                "hosts": {"api.test": "127.0.0.1", "more.test": "127.0.0.1"},
                "allow_addresses": ["127.0.0.1"],
                "inject": {f"api.test:{port}": {"X-Key": CANARY}},
            }
        )
    )
    done = sunroom("exec", "--network", str(policy), "-", stdin=fetch("api.test", port))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "'keyed'"
    refused = sunroom("exec", "--network", str(policy), "-", stdin=fetch("more.test", port))
    assert refused.stdout.strip() == "403"
    added = sunroom(
        "exec", "--network", str(policy), "--allow-host", f"more.test:{port}", "-",
        stdin=fetch("more.test", port),
    )  # fmt: skip
    assert added.stdout.strip() == "'plain'", added.stderr
    for out in (done, refused, added):
        assert CANARY not in out.stdout + out.stderr


def test_bad_network_options_are_one_line_errors(tmp_path: Path) -> None:
    bad = sunroom("exec", "--allow-host", "*.*", "-", stdin="1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--allow-host" in bad.stderr
    sub = sunroom("exec", "--backend", "subprocess", "--allow-host", "pypi.org", "-", stdin="1")
    assert sub.returncode == 2 and "cannot enforce a network policy" in sub.stderr
    secret = tmp_path / "net.json"
    secret.write_text(json.dumps({"allow": ["a.test"], "inject": {"b.test": {"X-Key": CANARY}}}))
    shown = sunroom("serve", "--network", f"api={secret}", "--port", "0")
    assert shown.returncode == 2 and "not covered" in shown.stderr
    assert CANARY not in shown.stderr
    missing = sunroom("serve", "--network", "api", "--port", "0")
    assert missing.returncode == 2 and "NAME=FILE" in missing.stderr
