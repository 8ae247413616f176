"""Shared bits of the agent examples: pick a model from the environment, print events."""

from __future__ import annotations

import argparse
import os
import sys

from sunroom.agent import events as ev
from sunroom.providers import Model, model


def example_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every agent example takes: --fake (offline, scripted), --backend, --code-mode."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--fake", action="store_true", help="use scripted models (offline)")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker", "subprocess"])
    parser.add_argument(
        "--code-mode",
        default="tool",
        choices=["tool", "fenced"],
        help="fenced: ```python blocks instead of the execute_code tool (models without tool calling)",
    )
    return parser


def configured_model() -> Model:
    """The model named by SUNROOM_MODEL (e.g. ``anthropic:claude-haiku-4-5``, or
    ``scripted:replies.json`` for replies read from a file)."""
    spec = os.environ.get("SUNROOM_MODEL")
    if not spec:
        sys.exit("set SUNROOM_MODEL (and SUNROOM_BASE_URL for a local server), or pass --fake")
    return model(spec, base_url=os.environ.get("SUNROOM_BASE_URL") or None)


def show(event: ev.Event) -> None:
    """Print one event as a short line."""
    if isinstance(event, ev.CodeSubmitted):
        print(f"--- turn {event.turn}: code\n{event.code}")
    elif isinstance(event, ev.ExecutionFinished):
        print(f"--- {event.status} ({event.duration_s * 1000:.0f} ms)\n{event.output}")
    elif isinstance(event, ev.AssistantText):
        print(f"--- model: {event.text[:400]}")
    elif isinstance(event, ev.HostCallFinished):
        print(f"    {event.name}() {event.duration_s * 1000:.0f} ms")
    elif isinstance(event, ev.SubmitRejected | ev.Vetoed | ev.SessionError | ev.BudgetWarning):
        print(f"!!! {type(event).__name__}: {event}")
