"""The optional parts of sunroom: which extra installs each, and the check that names it.

A core install (``pip install sunroom``) runs bwrap and subprocess kernels, agent sessions and
the CLI. Everything else is an extra of ``pyproject.toml``; the code behind an extra calls
:func:`require` before it imports the extra's packages, so a missing one is a single sentence
that says what to install, never an ``ImportError`` from deep inside a dependency.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Final

from sunroom.errors import SunroomError, UsageError

#: extra name -> the top-level modules it provides (checked in order; the first missing one is
#: named in the error). ``tests/test_extras.py`` holds these against ``pyproject.toml``.
EXTRAS: Final[Mapping[str, tuple[str, ...]]] = {
    "docker": ("docker",),
    "service": (
        "starlette",
        "uvicorn",
        "httptools",
        "python_multipart",
        "prometheus_client",
        "aiohttp",
    ),
    "jupyter": ("jupyter_client",),
    "notebook": ("nbformat",),
    "mcp": ("mcp",),
    "embeddings": ("numpy", "onnxruntime", "tokenizers", "onnx", "safetensors"),
    "providers": ("httpx", "anthropic", "openai", "google.genai"),
    "smolagents": ("smolagents",),
    "client": ("httpx",),
    "rlm": ("rlm",),
    "dspy": ("dspy",),
    "eval": ("matplotlib",),
    "e2b": ("e2b_code_interpreter",),
    "postgres": ("psycopg", "psycopg_pool"),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}


def missing(extra: str) -> str | None:
    """The first module of *extra* that cannot be imported here, or None when all can."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a parent package (``google`` of ``google.genai``) is absent
            found = False
        if not found:
            return module
    return None


def require(extra: str, what: str, error: type[SunroomError] = UsageError) -> None:
    """Raise *error* saying that *what* needs ``sunroom[extra]`` when a module of it is missing.

    *what* names the feature for a person (``"the docker backend"``, ``"sunroom serve"``).
    Unknown extras are a programming error (KeyError).
    """
    module = missing(extra)
    if module is not None:
        hint = f"pip install 'sunroom[{extra}]'"
        raise error(f"{what} needs the {extra} extra ({module} is missing): {hint}")
