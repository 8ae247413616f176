"""Starting one kernel process until it is ready: launched, connected, hello checked.

Shared by :class:`~sunroom.sandbox.kernel.AsyncKernel` (cold starts) and
:class:`~sunroom.sandbox.pool.KernelPool` (warm kernels started ahead of need). A ready kernel
has no host functions and no inputs yet: its owner installs and binds them.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final

from sunroom.errors import KernelError, KernelStartError
from sunroom.rpc.channel import Channel
from sunroom.rpc.codec import PROTOCOL_VERSION
from sunroom.sandbox.backend import (
    DEFAULT_SITE_BYTES,
    Backend,
    InputMount,
    KernelProcess,
    LaunchSpec,
)
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import Egress


@final
@dataclass(eq=False)
class Router:
    """Routes a kernel's notifications: the hello, output, and the copies a fork names.

    The hello goes to a future, output to ``on_output``, each copy a fork names as the kernel
    makes it (``forked``) to ``on_forked``, set only while a fork is asked for.
    """

    hello: asyncio.Future[Any]
    on_output: Callable[[str, str], None] | None = None
    on_forked: Callable[[int], None] | None = None

    def __call__(self, method: str, params: object) -> None:
        """Handle one notification (the channel calls this)."""
        if method == "stream":
            if self.on_output is not None and isinstance(params, dict):
                name, text = params.get("name"), params.get("text")
                if isinstance(name, str) and isinstance(text, str):
                    self.on_output(name, text)
        elif method == "hello" and not self.hello.done():
            self.hello.set_result(params)
        elif method == "forked" and self.on_forked is not None and isinstance(params, dict):
            pid = params.get("pid")
            if isinstance(pid, int):
                self.on_forked(pid)


@final
@dataclass(eq=False)
class Ready:
    """A started kernel: its process, its channel (no request handler yet) and its hello."""

    proc: KernelProcess
    channel: Channel
    router: Router
    info: dict[str, Any] = field(default_factory=dict)

    async def discard(self) -> None:
        """Close the channel and kill the process tree."""
        await self.channel.aclose()
        await self.proc.kill()


def check_hello(info: object, nonce: str) -> None:
    """Raise KernelStartError unless *info* is a hello with *nonce*, our protocol and a pid."""
    if not isinstance(info, dict) or not secrets.compare_digest(str(info.get("nonce", "")), nonce):
        raise KernelStartError("the kernel's hello did not carry the expected nonce")
    if info.get("protocol") != PROTOCOL_VERSION:
        raise KernelStartError(
            f"kernel speaks protocol {info.get('protocol')}, host speaks {PROTOCOL_VERSION}"
        )
    if not isinstance(info.get("pid"), int):
        raise KernelStartError("the kernel's hello carried no pid")


async def failure_detail(proc: KernelProcess) -> str:
    """The kernel's early log, formatted for a KernelStartError ('' when there is none)."""
    try:
        tail = await proc.log_tail()
    except Exception as exc:  # diagnostics must never hide the real failure
        tail = f"(log unavailable: {exc!r})"
    return f"\n--- kernel log ---\n{tail.strip()}" if tail.strip() else ""


async def launch(
    backend: Backend,
    *,
    limits: Limits,
    env: dict[str, str],
    mounts: tuple[InputMount, ...] = (),
    network: Egress | None = None,
    site_bytes: int = DEFAULT_SITE_BYTES,
    tenants: int = 0,
) -> Ready:
    """Launch a kernel and wait for its hello; the caller owns the result and must discard it.

    Raises SandboxUnavailableError when the backend cannot provide its boundary and
    KernelStartError (with the kernel's early log) when the kernel fails to come up: it ended
    before saying hello, said it wrong, or stayed silent past ``limits.start_timeout_s``.
    """
    nonce = secrets.token_hex(16)
    proc, sock = await backend.launch(
        LaunchSpec(
            limits=limits,
            nonce=nonce,
            env=env,
            mounts=mounts,
            site_bytes=site_bytes,
            network=network,
            tenants=tenants,
        )
    )
    router = Router(asyncio.get_running_loop().create_future())
    channel: Channel | None = None
    try:
        channel = await Channel.open(sock, on_notification=router, max_frame=limits.max_frame_bytes)
        await asyncio.wait(
            {router.hello, channel.closed},
            timeout=limits.start_timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not router.hello.done():
            if channel.closed.done():
                why = await proc.exit_reason()
                raise KernelStartError(f"the kernel ended before saying hello: {why}")
            raise KernelStartError(
                f"the kernel did not say hello within {limits.start_timeout_s:g} s"
            )
        info = router.hello.result()
        check_hello(info, nonce)
        proc.adopt(int(info["pid"]))
        return Ready(proc, channel, router, dict(info))
    except BaseException as exc:
        detail = await failure_detail(proc)
        if channel is not None:
            await channel.aclose()
        else:
            sock.close()
        await proc.kill()
        if isinstance(exc, asyncio.CancelledError):
            raise
        if isinstance(exc, KernelStartError):
            raise KernelStartError(f"{exc}{detail}") from exc.__cause__
        if isinstance(exc, KernelError):
            raise
        raise KernelStartError(f"the kernel did not start: {exc!r}{detail}") from exc
