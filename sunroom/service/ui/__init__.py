"""The web view's static files: the page, its style sheet and its ES modules (no build step).

:data:`STATIC_DIR` is the folder the server serves under ``/ui/static/``; ``index.html`` in it
is the page itself.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC_DIR"]

STATIC_DIR = Path(__file__).parent / "static"
