"""Building a session's model from its name: :func:`resolve_model`.

It is :func:`sunroom.providers.model`: ``anthropic:``, ``openai:``, ``openai-compatible:``
(with ``base_url``), ``gemini:`` and ``scripted:PATH`` (replies read from a JSON file, for
demos and tests with no key; see :class:`~sunroom.providers.fakes.ScriptFileModel`). Tests
inject their own resolver into :func:`~sunroom.service.create_app` instead.
"""

from __future__ import annotations

from sunroom.providers import Model
from sunroom.providers import model as build_model

__all__ = ["resolve_model"]


def resolve_model(spec: str, base_url: str | None) -> Model:
    """The model named *spec* (the caller closes it).

    Raises UsageError (unknown provider, a scripted model's file is not a script) and
    AuthenticationError (no API key).
    """
    return build_model(spec, base_url=base_url)
