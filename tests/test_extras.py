"""The extras: pyproject.toml and sunroom.extras agree, and a plain kernel needs none of them.

tests/smoke/ installs the wheel without extras and checks each missing one's error; here,
where every extra is installed, an import trace proves the kernel API does not load them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sunroom.extras import EXTRAS, missing

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]

#: a distribution of pyproject.toml -> the module sunroom.extras checks for it
MODULE_OF = {
    "docker": "docker",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "python-multipart": "python_multipart",
    "jupyter-client": "jupyter_client",
    "nbformat": "nbformat",
    "mcp": "mcp",
    "onnxruntime": "onnxruntime",
    "tokenizers": "tokenizers",
    "numpy": "numpy",
    "onnx": "onnx",
    "safetensors": "safetensors",
    "httpx": "httpx",
    "anthropic": "anthropic",
    "openai": "openai",
    "google-genai": "google.genai",
    "smolagents": "smolagents",
    "rlms": "rlm",
    "dspy": "dspy",
    "matplotlib": "matplotlib",
    "e2b-code-interpreter": "e2b_code_interpreter",
    "prometheus-client": "prometheus_client",
    "aiohttp": "aiohttp",
    "psycopg": "psycopg",
    "psycopg-pool": "psycopg_pool",
    "opentelemetry-sdk": "opentelemetry.sdk",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry.exporter.otlp.proto.http",
}

HEAVY = ("zmq", "tornado", "docker", "mcp", "onnxruntime", "starlette", "uvicorn")


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_checks_the_modules_its_distributions_provide(extra: str) -> None:
    assert extra in OPTIONAL, f"pyproject.toml has no extra {extra!r}"
    provided = {MODULE_OF.get(_distribution(r)) for r in OPTIONAL[extra]}
    assert set(EXTRAS[extra]) <= provided, (extra, EXTRAS[extra], provided)
    assert missing(extra) is None  # the dev install has every extra


def test_the_all_extra_names_every_other_one() -> None:
    (spec,) = OPTIONAL["all"]
    named = set(spec.split("[", 1)[1].rstrip("]").split(","))
    assert named == set(OPTIONAL) - {"all", "dev"}


def test_a_core_dependency_is_no_extra() -> None:
    core = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra, modules in EXTRAS.items():
        assert not core & {_distribution(r) for r in OPTIONAL[extra]}, extra
        assert modules


@pytest.mark.kernel
def test_the_kernel_and_session_api_imports_no_extra() -> None:
    """``import sunroom; sunroom.Kernel`` (and the session classes) with every extra installed
    loads none of the heavy ones: they are imported only by what needs them."""
    code = (
        "import json, sys\n"
        "import sunroom\n"
        "sunroom.Kernel, sunroom.AsyncKernel, sunroom.Session, sunroom.AsyncSession\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(proc.stdout))
    assert "sunroom" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
