"""Resolve a model from a ``"<provider>:<name>"`` string."""

from __future__ import annotations

import importlib
from typing import Any, Unpack

from sunroom.errors import UsageError

from .config import ModelOptions
from .seam import Model

__all__ = ["PROVIDERS", "model"]

#: Prefix → (module, class) of the adapter it builds.
PROVIDERS: dict[str, tuple[str, str]] = {
    "anthropic": ("sunroom.providers.anthropic", "AnthropicModel"),
    "openai": ("sunroom.providers.openai_responses", "OpenAIResponsesModel"),
    "openai-compatible": ("sunroom.providers.openai_chat", "OpenAIChatModel"),
    "gemini": ("sunroom.providers.gemini", "GeminiModel"),
    "scripted": ("sunroom.providers.fakes", "ScriptFileModel"),
}

#: Local model servers people name as a prefix → their OpenAI-compatible endpoint by default.
_LOCAL_SERVERS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434/v1",
    "lmstudio": "http://127.0.0.1:1234/v1",
    "vllm": "http://127.0.0.1:8000/v1",
    "llamacpp": "http://127.0.0.1:8080/v1",
}


def model(
    spec: str,
    /,
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Unpack[ModelOptions],
) -> Model:
    """Build the model named by ``spec``, e.g. ``model("anthropic:claude-sonnet-4-5")``.

    Prefixes: ``anthropic:`` (Messages API), ``openai:`` (Responses API),
    ``openai-compatible:`` (Chat Completions, for vLLM, llama.cpp, Ollama ... via
    ``base_url``), ``gemini:``, and ``scripted:PATH``: replies read from a JSON file, for
    demos and tests with no key and no network (see
    :class:`~sunroom.providers.fakes.ScriptFileModel`). Everything after the first colon is
    the model name, so ``"openai-compatible:llama3.2:3b"`` works. Keys default to the vendor's
    usual environment variable. The caller owns the model and must ``aclose()`` it.

    Raises:
        UsageError: the spec has no known prefix (for a local server's name, such as
            ``ollama:``, the message says to use ``openai-compatible:`` and its URL), or a
            scripted model's file is not a script.
        AuthenticationError: no API key was given or found (where one is required).
    """
    prefix, sep, name = spec.partition(":")
    known = ", ".join(f"{p}:" for p in PROVIDERS)
    if not sep or not name:
        raise UsageError(f"model spec {spec!r} must look like '<provider>:<model>'; known: {known}")
    target = PROVIDERS.get(prefix)
    if target is None:
        hint = ""
        if prefix.lower() in _LOCAL_SERVERS:
            hint = (
                f"; {prefix} serves the OpenAI API: use 'openai-compatible:{name}' with the base "
                f"URL {_LOCAL_SERVERS[prefix.lower()]}"
            )
        raise UsageError(f"unknown provider {prefix!r} in {spec!r}; known: {known}{hint}")
    module, cls_name = target
    cls: Any = getattr(importlib.import_module(module), cls_name)
    built: Model = cls(name, api_key=api_key, base_url=base_url, **options)
    return built
