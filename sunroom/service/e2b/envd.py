"""TEMPORARY local stub (replaced by the envd helper's module)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sunroom.sandbox.kernel import AsyncKernel


@dataclass(frozen=True, slots=True)
class EnvdTarget:
    kernel: AsyncKernel
    workdir: str
    sandbox_id: str


Resolve = Callable[[Request], Awaitable[EnvdTarget]]


def envd_routes(resolve: Resolve, *, max_file_bytes: int) -> list[Route]:
    async def health(request: Request) -> Response:
        from sunroom.service.problems import NotFoundError

        try:
            await resolve(request)
        except NotFoundError as exc:
            from starlette.responses import JSONResponse

            return JSONResponse({"code": 502, "message": str(exc)}, status_code=502)
        return Response(status_code=204)

    return [Route("/health", health, methods=["GET"])]
