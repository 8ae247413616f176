"""Every route of the E2B facade, listed: :data:`FACADE_ROUTES`.

The facade's routes are not in the main app's route table (:class:`~sunroom.service.e2b.E2BRoutes`
hands their requests over before it), so ``/openapi.json`` is built from this list too.
``tests/service/test_e2b_catalog.py`` checks it against the routes the facade's parts
(:func:`~sunroom.service.e2b.control.control_routes`,
:func:`~sunroom.service.e2b.interpreter.interpreter_routes`,
:func:`~sunroom.service.e2b.envd.envd_routes`) actually serve.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FACADE_ROUTES", "UNCOVERED_METHODS", "UNCOVERED_PATHS"]

UNCOVERED_PATHS: Final = (
    "/sandboxes/{rest:path}",
    "/v2/sandboxes/{rest:path}",
    "/templates{rest:path}",
    "/v2/templates{rest:path}",
    "/v3/templates{rest:path}",
    "/snapshots{rest:path}",
    "/volumes{rest:path}",
    "/secrets{rest:path}",
)
"""The control plane's catch-alls: what E2B's API has and the facade does not cover (501;
:func:`~sunroom.service.e2b.control.control_routes` routes them from here)."""

UNCOVERED_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")
"""The methods every catch-all answers."""

FACADE_ROUTES: Final[tuple[tuple[str, str], ...]] = (
    # the control plane (E2B's REST API)
    ("/sandboxes", "POST"),
    ("/v2/sandboxes", "POST"),
    ("/sandboxes", "GET"),
    ("/v2/sandboxes", "GET"),
    ("/sandboxes/{sid}", "GET"),
    ("/sandboxes/{sid}", "DELETE"),
    ("/sandboxes/{sid}/timeout", "POST"),
    ("/sandboxes/{sid}/refreshes", "POST"),
    ("/sandboxes/{sid}/connect", "POST"),
    ("/v2/sandboxes/{sid}/connect", "POST"),
    *((path, method) for path in UNCOVERED_PATHS for method in UNCOVERED_METHODS),
    # the code interpreter (E2b-Sandbox-Port 49999)
    ("/execute", "POST"),
    ("/contexts", "POST"),
    ("/contexts", "GET"),
    ("/contexts/{cid}/restart", "POST"),
    ("/contexts/{cid}", "DELETE"),
    ("/health", "GET"),  # envd's too (any other E2b-Sandbox-Port)
    # envd (a sandbox's files)
    ("/files", "GET"),
    ("/files", "POST"),
    ("/filesystem.Filesystem/{method}", "POST"),  # ListDir, Stat, Remove; the rest 501
    ("/process.Process/{method}", "POST"),  # commands: 501
)
"""(Starlette path, method) of every facade route at the server's root; each also answers
under ``/e2b``. ``GET /health`` is the code interpreter's and envd's (one entry)."""
