"""Test wheels: the real ones scripts/test-wheels.sh downloads, and small ones built here.

A built wheel is a valid one (``METADATA``, ``WHEEL`` and a ``RECORD`` with sha256 hashes):
pip installs it like any other. Used for what no real package does on purpose: an import that
raises, a wheel too big for a small budget, two versions of one name.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABULATE = ("tabulate", "0.9.0")
TOOLZ = ("toolz", "1.0.0")


def real_wheelhouse() -> Path:
    """The downloaded wheels ($SUNROOM_TEST_WHEELS or .venv/sunroom-test-wheels).

    Skips when they were not fetched, unless CI runs (then the missing fetch fails the test).
    """
    env = os.environ.get("SUNROOM_TEST_WHEELS")
    path = Path(env) if env else ROOT / ".venv" / "sunroom-test-wheels"
    if not (path / ".complete").exists():
        message = f"the test wheels are not in {path}: run scripts/test-wheels.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(directory: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding *files* into *directory*."""
    dist_info = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    contents[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sunroom-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{path},{_digest(data)},{len(data)}\n" for path, data in contents.items())
    record += f"{dist_info}/RECORD,,\n"
    contents[f"{dist_info}/RECORD"] = record.encode()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for member, data in contents.items():
            whl.writestr(member, data)
    path.chmod(0o644)
    return path
