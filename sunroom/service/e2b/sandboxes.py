"""E2B sandboxes as sunroom kernels: :class:`Sandboxes`, the facade's registry and lifecycle.

An E2B sandbox here is one sunroom kernel, its *default context*, plus one kernel per extra
code context (``POST /contexts``), all of this server's backend (or of one of its templates).
Each context is a kernel of its own in a sandbox of its own: contexts share the E2B sandbox's
lifetime and tokens, not a filesystem (``sandbox.files`` reaches the default context's
workdir). A sandbox is handed out once; its kernels are never reused (a warm pool's kernel is
taken, never returned).

Lifetime: a sandbox lives ``timeout`` seconds from its creation (E2B's default, 300, when the
request names none; at most ``config.e2b_max_timeout_s``); ``POST /sandboxes/{id}/timeout``
sets a new end counted from now, ``connect`` extends it when the new end is later. At its end
the reaper kills it, as ``DELETE`` does: every context's kernel is closed, a cell that runs is
cut off, and the sandbox's id answers "was not found" from then on.

Credentials: every sandbox gets two random tokens, E2B's ``envdAccessToken`` (sent by the SDK
as ``X-Access-Token`` to envd and ``/execute``) and ``trafficAccessToken`` (sent as
``E2B-Traffic-Access-Token`` to the code-interpreter routes); the control plane, guarded by the
server's own token, hands them out on create and connect only.

Capacity: at most ``config.max_kernels`` kernels over all sandboxes' contexts (429 beyond).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, final

from sunroom.errors import SunroomError, UsageError
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.pool import KernelPool
from sunroom.service.config import ServiceConfig
from sunroom.service.probes import NO_PROBE, Probe
from sunroom.service.problems import CapacityError, NotFoundError, Unsupported
from sunroom.service.templates import Templates

__all__ = [
    "DEFAULT_TEMPLATES",
    "DEFAULT_TIMEOUT_S",
    "ENVD_VERSION",
    "PRELUDE",
    "Context",
    "Sandbox",
    "Sandboxes",
]

log = logging.getLogger("sunroom.service")

DEFAULT_TIMEOUT_S: Final = 300
"""A sandbox's lifetime when the request names none (E2B's default)."""

DEFAULT_TEMPLATES: Final = frozenset({"base", "code-interpreter-v1", "code-interpreter"})
"""E2B's own template names: each means this server's default kernel."""

ENVD_VERSION: Final = "0.6.7"
"""The envd version sandboxes report: the SDK picks its wire features by it (octet-stream
uploads need 0.5.7)."""

LANGUAGES: Final = {"python": "python", "py": "python", "python3": "python"}
"""The context languages served (E2B's names for Python); any other answers 501."""

REAP_EVERY_S: Final = 1.0
"""How often sandboxes past their end are looked for."""

MAX_METADATA: Final = 64
"""Metadata entries a sandbox may carry (each key and value at most 256 characters)."""

PRELUDE: Final = "__import__('sunroom.prelude.e2b', fromlist=['install'])"
"""The kernel-side module (:mod:`sunroom.prelude.e2b`) as an expression that binds no name in
the user's namespace; the facade's setup cells call its functions through it."""


MAX_ENV_VARS: Final = 256
"""Environment variables a sandbox or one execution may set."""


def check_envs(envs: Mapping[str, str]) -> None:
    """Raise UsageError unless *envs* can be environment variables (at most MAX_ENV_VARS)."""
    if len(envs) > MAX_ENV_VARS:
        raise UsageError(f"at most {MAX_ENV_VARS} environment variables may be set at once")
    for key, value in envs.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise UsageError(
                f"environment variable {key[:40]!r} is not valid: a name must be non-empty "
                "without '=' or NUL, and a value without NUL"
            )


def language_of(language: str | None) -> str:
    """E2B's language name normalised (None: Python); raises Unsupported for another language."""
    if language is None or not language.strip():
        return "python"
    name = LANGUAGES.get(language.strip().lower())
    if name is None:
        raise Unsupported(
            f"sunroom's E2B API runs Python only; {language[:40]!r} contexts are not available"
        )
    return name


@final
@dataclass(eq=False)
class Context:
    """One code context: a kernel, its E2B execution count, and the sink of its running cell.

    ``lock`` orders the context's executions (the env set for one, its cell, the env reset);
    ``sink`` receives the running cell's output as ``(stream, text)``.
    """

    context_id: str
    language: str
    cwd: str
    kernel: AsyncKernel
    executions: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sink: Callable[[str, str], None] | None = None

    def route_output(self, stream: str, text: str) -> None:
        """The kernel's ``on_output``: pass the running cell's output to its sink."""
        if self.sink is not None:
            self.sink(stream, text)


@final
@dataclass(eq=False)
class Sandbox:
    """One E2B sandbox: its contexts, tokens, metadata and lifetime (Unix times)."""

    sandbox_id: str
    template_id: str
    started_at: float
    end_at: float
    metadata: dict[str, str]
    envs: dict[str, str]
    envd_token: str
    traffic_token: str
    workdir: str
    default: Context
    contexts: dict[str, Context] = field(default_factory=dict)
    alive: bool = True

    def context(self, context_id: str | None) -> Context:
        """The context *context_id* (None: the default one). Raises NotFoundError."""
        if context_id is None:
            return self.default
        found = self.contexts.get(context_id)
        if found is None:
            raise NotFoundError(f"Context {context_id[:80]} not found")
        return found


@final
class Sandboxes:
    """The E2B sandboxes of one server. ``await start()`` before use, ``aclose()`` after.

    *functions* are the host functions every sandbox's kernels get (the server's).
    """

    def __init__(
        self,
        *,
        config: ServiceConfig,
        functions: Sequence[HostFunction] = (),
        probe: Probe = NO_PROBE,
    ) -> None:
        self.config = config
        self._probe = probe
        self._functions = tuple(functions)
        self._templates: Templates | None = None
        self._sandboxes: dict[str, Sandbox] = {}
        self._kernels = 0  # started or starting, over every sandbox
        self._pool: KernelPool | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pool(self) -> KernelPool | None:
        """The warm pool of default kernels (``config.e2b_pool`` > 0), once started."""
        return self._pool

    @property
    def live(self) -> int:
        """Sandboxes alive now."""
        return len(self._sandboxes)

    async def start(self, templates: Templates) -> None:
        """Start the reaper and, when ``config.e2b_pool`` asks for one, the warm pool.

        *templates* are the server's (shared with its sessions and raw kernels).
        """
        self._templates = templates
        if self.config.e2b_pool > 0:
            pool = KernelPool(backend=self.config.kernel_backend(), size=self.config.e2b_pool)
            await pool.__aenter__()
            self._pool = pool
        self._reaper = asyncio.create_task(self._reap(), name="sunroom-e2b-reaper")

    # -- lifecycle --------------------------------------------------------------------------

    async def create(
        self,
        template: str,
        *,
        timeout_s: int | None,
        metadata: Mapping[str, str],
        envs: Mapping[str, str],
    ) -> Sandbox:
        """Start a sandbox from *template* (an E2B default name or one of the server's).

        Raises NotFoundError (unknown template), UsageError (a bad timeout or metadata),
        CapacityError, KernelStartError, SandboxUnavailableError.
        """
        lifetime = self._lifetime(timeout_s)
        check_envs(envs)
        if len(metadata) > MAX_METADATA or any(
            len(k) > 256 or len(v) > 256 for k, v in metadata.items()
        ):
            raise UsageError(
                f"metadata holds at most {MAX_METADATA} entries of at most 256 characters each"
            )
        if template not in DEFAULT_TEMPLATES and template not in self.config.templates:
            known = sorted(DEFAULT_TEMPLATES | set(self.config.templates))
            raise NotFoundError(
                f"template {template[:80]!r} not found; this server has: {', '.join(known)}"
            )
        ctx = await self._context(template, "python", None, envs)
        sid = "sr" + secrets.token_hex(10)
        now = time.time()
        sandbox = Sandbox(
            sandbox_id=sid,
            template_id=template,
            started_at=now,
            end_at=now + lifetime,
            metadata=dict(metadata),
            envs=dict(envs),
            envd_token=secrets.token_urlsafe(24),
            traffic_token=secrets.token_urlsafe(24),
            workdir=ctx.cwd,
            default=ctx,
        )
        sandbox.contexts[ctx.context_id] = ctx
        if self._closed:  # the server stopped while the kernel started
            await self._close_contexts(sandbox)
            raise UsageError("the server is stopping")
        self._sandboxes[sid] = sandbox
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox:
        """The live sandbox *sandbox_id*. Raises NotFoundError."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None or not sandbox.alive:
            raise NotFoundError(f"The sandbox {sandbox_id[:80]} was not found")
        return sandbox

    def listing(self) -> list[Sandbox]:
        """The live sandboxes, oldest first."""
        return [s for s in self._sandboxes.values() if s.alive]

    def set_timeout(self, sandbox_id: str, timeout_s: int) -> Sandbox:
        """Let the sandbox live *timeout_s* seconds from now. Raises NotFoundError, UsageError."""
        sandbox = self.get(sandbox_id)
        sandbox.end_at = time.time() + self._lifetime(timeout_s)
        return sandbox

    def connect(self, sandbox_id: str, timeout_s: int | None) -> Sandbox:
        """The sandbox, its end moved to *timeout_s* from now when that is later."""
        sandbox = self.get(sandbox_id)
        if timeout_s is not None:
            sandbox.end_at = max(sandbox.end_at, time.time() + self._lifetime(timeout_s))
        return sandbox

    async def kill(self, sandbox_id: str) -> None:
        """Kill the sandbox: close its contexts' kernels. Raises NotFoundError."""
        sandbox = self.get(sandbox_id)
        sandbox.alive = False
        del self._sandboxes[sandbox_id]
        await self._close_contexts(sandbox)

    # -- contexts ---------------------------------------------------------------------------

    async def add_context(self, sandbox: Sandbox, language: str | None, cwd: str | None) -> Context:
        """Start another context of *sandbox* (a kernel of its own, same template and env)."""
        ctx = await self._context(sandbox.template_id, language_of(language), cwd, sandbox.envs)
        if not sandbox.alive:  # killed while the kernel started
            await ctx.kernel.aclose()
            self._kernels -= 1
            raise NotFoundError(f"The sandbox {sandbox.sandbox_id} was not found")
        sandbox.contexts[ctx.context_id] = ctx
        return ctx

    async def remove_context(self, sandbox: Sandbox, context_id: str) -> None:
        """Close context *context_id* (the default one included). Raises NotFoundError."""
        ctx = sandbox.context(context_id)
        del sandbox.contexts[context_id]
        await self._close(ctx)

    async def restart_context(self, sandbox: Sandbox, context_id: str) -> None:
        """Restart the context's kernel: its variables are gone, its id, cwd and env stay."""
        ctx = sandbox.context(context_id)
        async with ctx.lock:
            await ctx.kernel.restart()
            await self.prepare_again(sandbox, ctx)
            ctx.executions = 0

    async def prepare_again(self, sandbox: Sandbox, ctx: Context) -> None:
        """Set a restarted kernel of *ctx* up again (a restart, or a cell that lost the state).

        The caller holds ``ctx.lock``.
        """
        await self._prepare(ctx.kernel, sandbox.envs, ctx.cwd)

    # -- parts ------------------------------------------------------------------------------

    def _lifetime(self, timeout_s: int | None) -> int:
        if timeout_s is None:
            return DEFAULT_TIMEOUT_S
        top = self.config.e2b_max_timeout_s
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int)
            or not 0 < timeout_s <= top
        ):
            raise UsageError(f"timeout must be a whole number of seconds from 1 to {top}")
        return timeout_s

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        bound = self.config.max_kernels
        if self._kernels >= bound:
            raise CapacityError(f"this server runs its limit of {bound} E2B sandbox kernels")
        self._kernels += 1
        try:
            yield
        except BaseException:
            self._kernels -= 1
            raise

    async def _context(
        self, template: str, language: str, cwd: str | None, envs: Mapping[str, str]
    ) -> Context:
        with self._counted():
            pool = self._pool if template in DEFAULT_TEMPLATES else None
            began, hit = time.monotonic(), pool is not None and pool.idle() > 0
            if template in DEFAULT_TEMPLATES:
                if self._pool is not None:
                    kernel = AsyncKernel(pool=self._pool, functions=self._functions)
                else:
                    kernel = AsyncKernel(
                        backend=self.config.kernel_backend(), functions=self._functions
                    )
            else:
                if self._templates is None:
                    raise RuntimeError("Sandboxes.start() was not called")
                started = await self._templates.get(template)
                kernel = AsyncKernel(template=started, functions=self._functions)
            try:
                await kernel.start()
                if pool is not None:
                    self._probe.pool_claimed("e2b", hit=hit, seconds=time.monotonic() - began)
                workdir = await self._prepare(kernel, envs, cwd)
            except BaseException:
                await kernel.aclose()
                raise
        ctx = Context(
            context_id=secrets.token_hex(8), language=language, cwd=workdir, kernel=kernel
        )
        kernel.on_output = ctx.route_output
        return ctx

    async def _prepare(self, kernel: AsyncKernel, envs: Mapping[str, str], cwd: str | None) -> str:
        """Install E2B's behaviour in a (re)started kernel; return its working directory."""
        code = f"{PRELUDE}.install({dict(envs)!r}, cwd={cwd!r})"
        out = await kernel.execute(code, timeout_s=30.0)
        if not out.ok or out.value is None:
            message = out.error.message if out.error is not None else out.status
            if cwd is not None:
                raise UsageError(f"the context could not start in {cwd[:200]!r}: {message}")
            raise SunroomError(f"the sandbox's kernel failed to set up: {message}")
        workdir = ast.literal_eval(out.value)
        if not isinstance(workdir, str):
            raise SunroomError("the sandbox's kernel reported no working directory")
        return workdir

    async def _close(self, ctx: Context) -> None:
        ctx.sink = None
        try:
            await ctx.kernel.aclose()
        except Exception:
            log.exception("closing an E2B context's kernel failed")
        finally:
            self._kernels -= 1

    async def _close_contexts(self, sandbox: Sandbox) -> None:
        contexts, sandbox.contexts = list(sandbox.contexts.values()), {}
        await asyncio.gather(*(self._close(ctx) for ctx in contexts))

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            now = time.time()
            for sid in [s.sandbox_id for s in self._sandboxes.values() if s.end_at <= now]:
                try:
                    await self.kill(sid)
                except NotFoundError:
                    pass  # killed meanwhile
                except Exception:
                    log.exception("killing an E2B sandbox at its end failed")

    async def aclose(self) -> None:
        """Kill every sandbox and stop the pool."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for sid in list(self._sandboxes):
            with contextlib.suppress(NotFoundError):
                await self.kill(sid)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.__aexit__(None, None, None)
