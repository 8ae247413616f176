from __future__ import annotations

from pathlib import Path

import pytest

from sunroom.errors import AuthenticationError, UsageError
from sunroom.providers import (
    AnthropicModel,
    ClientConfig,
    GeminiModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    model,
)
from sunroom.providers.registry import PROVIDERS

SECRET = "sk-super-secret-0123456789"
HEADER = "header-secret-value"


@pytest.mark.parametrize(
    ("spec", "cls", "name"),
    [
        ("anthropic:claude-sonnet-4-5", AnthropicModel, "claude-sonnet-4-5"),
        ("openai:gpt-5", OpenAIResponsesModel, "gpt-5"),
        ("openai-compatible:llama3.2:3b", OpenAIChatModel, "llama3.2:3b"),
        ("gemini:gemini-2.5-flash", GeminiModel, "gemini-2.5-flash"),
    ],
)
async def test_resolves_each_prefix(spec: str, cls: type, name: str) -> None:
    async with model(spec, api_key=SECRET, base_url="http://127.0.0.1:9/v1") as m:
        assert type(m) is cls
        assert m.name == name
        assert m.config.base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]


def test_bad_specs() -> None:
    with pytest.raises(UsageError, match="known: anthropic:, openai:"):
        model("mistral:large")
    with pytest.raises(UsageError, match="<provider>:<model>"):
        model("claude-sonnet-4-5")


def test_keys_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "a-key")
    monkeypatch.setenv("OPENAI_API_KEY", "o-key")
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", "g-key")
    assert model("anthropic:x").config.api_key == "a-key"  # type: ignore[attr-defined]
    assert model("openai:x").config.api_key == "o-key"  # type: ignore[attr-defined]
    assert model("gemini:x").config.api_key == "g-key"  # type: ignore[attr-defined]
    assert model("openai:x", api_key="explicit").config.api_key == "explicit"  # type: ignore[attr-defined]
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(AuthenticationError):
        model("openai:x")


@pytest.mark.parametrize("spec", ["anthropic:m", "openai:m", "openai-compatible:m", "gemini:m"])
def test_reprs_hide_keys_and_header_values(spec: str) -> None:
    m = model(spec, api_key=SECRET, headers={"X-Org-Token": HEADER})
    for text in (repr(m), str(m), repr(m.config), str(m.config)):  # type: ignore[attr-defined]
        assert SECRET not in text and HEADER not in text
        assert "<hidden>" in text
    assert "X-Org-Token" in repr(m.config)  # type: ignore[attr-defined]


def test_config_repr_without_key() -> None:
    assert "api_key=None" in repr(ClientConfig())


def test_scripted_is_an_ordinary_provider(tmp_path: Path) -> None:
    assert "scripted" in PROVIDERS
    with pytest.raises(UsageError, match="scripted:"):
        model("mistral:large")
    (tmp_path / "r.json").write_text('["hi"]')
    built = model(f"scripted:{tmp_path / 'r.json'}", base_url="http://127.0.0.1:9/v1")
    assert built.name == "scripted"
