"""Request bodies as JSON: :func:`parse_json`, bounded in depth, shared by every route.

``MAX_JSON_DEPTH`` bounds the nesting of arrays and objects so a hostile body cannot make the
server recurse (422 beyond).
"""

from __future__ import annotations

import json
from typing import Any

from sunroom.errors import UsageError

__all__ = ["MAX_JSON_DEPTH", "parse_json"]


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (422 beyond)."""


def _too_deep(value: Any, limit: int) -> bool:
    """Whether *value* nests arrays/objects more than *limit* deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def parse_json(raw: bytes) -> Any:
    """*raw* as JSON (``{}`` when empty), at most MAX_JSON_DEPTH deep. Raises UsageError."""
    deep = UsageError(f"the body is nested too deep (at most {MAX_JSON_DEPTH} levels)")
    try:
        data = json.loads(raw or b"{}")
    except RecursionError:
        raise deep from None
    except ValueError as exc:
        raise UsageError(f"the body is not JSON: {exc}") from None
    if _too_deep(data, MAX_JSON_DEPTH):
        raise deep
    return data
