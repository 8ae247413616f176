"""The ``jupyter`` backend: any installed Jupyter kernel, run inside sunroom's sandbox.

``JupyterBackend(kernel_name, sandbox=...)`` starts the kernelspec through jupyter-client's
``AsyncKernelManager`` and sunroom's provisioner (:mod:`.provisioner`), which
runs the kernelspec's program under sunroom's supervisor in the chosen sandbox (``bwrap``,
``docker`` or ``none``: the ``subprocess`` backend). The kernel is ready when it has answered
``kernel_info`` and said hello on its sunroom channel (IPython kernels through sunroom's
extension; other languages through :mod:`sunroom.prelude.keeper`, which says hello for them).
Cells run through the Jupyter protocol (:class:`~.process.JupyterProcess`).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, final

import zmq

from sunroom.errors import KernelStartError, SandboxUnavailableError, UsageError
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend, BackendBase, KernelProcess, LaunchSpec
from sunroom.sandbox.backends.jupyter.messages import receive
from sunroom.sandbox.backends.jupyter.process import JupyterProcess, close_quietly
from sunroom.sandbox.backends.jupyter.provisioner import NAME, LaunchRequest, expect, forget
from sunroom.sandbox.backends.jupyter.specs import KernelSpecInfo, find_kernelspec
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.process import seal_ipc_dir

SANDBOXES = ("bwrap", "docker", "none")


def max_message_bytes(limits: Limits) -> int:
    """The largest Jupyter message the host accepts from a kernel with *limits*.

    The frame cap of sunroom's channel, or room for a full stream message (JSON escapes can
    grow text up to six times) or a display item in base64, whichever is larger.
    """
    return max(limits.max_frame_bytes, 6 * limits.max_output_bytes, 2 * limits.display_bytes)


@final
class JupyterBackend(BackendBase):
    """Start the Jupyter kernel *kernel_name* inside *sandbox* and drive it with jupyter-client.

    Args:
        kernel_name: an installed kernelspec (``sunroom kernelspecs`` lists them); an unknown
            name raises UsageError naming the installed ones.
        sandbox: ``"bwrap"`` (default), ``"docker"``, ``"none"`` (sunroom's ``subprocess``
            backend: supervised, not a boundary) or a Backend instance of those.
    """

    name = "jupyter"

    def __init__(self, kernel_name: str = "python3", *, sandbox: str | Backend = "bwrap") -> None:
        if not isinstance(kernel_name, str) or not kernel_name:
            raise UsageError("kernel_name must be a non-empty str")
        if isinstance(sandbox, str) and sandbox not in SANDBOXES:
            raise UsageError(f"unknown sandbox {sandbox!r}; choose one of {', '.join(SANDBOXES)}")
        if not isinstance(sandbox, str) and sandbox.name == self.name:
            raise UsageError("a Jupyter kernel's sandbox cannot be another Jupyter backend")
        self.spec: KernelSpecInfo = find_kernelspec(kernel_name)
        self._kernel_name = kernel_name
        self._sandbox_arg = sandbox
        self.sandbox = sandbox if isinstance(sandbox, str) else sandbox.name
        self._inner: Backend | None = None

    @property
    def kernel_name(self) -> str:
        """The kernelspec's name."""
        return self._kernel_name

    @property
    def python(self) -> bool:
        """Whether the kernel is an IPython kernel (host functions and inputs work in it)."""
        return self.spec.python

    @property
    def inputs_backend(self) -> str:
        """The sandbox backend's name: File and Directory inputs are placed as it places them."""
        if isinstance(self._sandbox_arg, str):
            return "subprocess" if self._sandbox_arg == "none" else self._sandbox_arg
        return self._sandbox_arg.name

    def _sandbox(self) -> Backend:
        if self._inner is None:
            arg = self._sandbox_arg
            self._inner = backends.resolve("subprocess" if arg == "none" else arg)
        return self._inner

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start the kernel and wait for its ``kernel_info``; see ``Backend.launch``.

        Raises SandboxUnavailableError when the sandbox cannot be had and KernelStartError
        (with the kernel's log) when the kernel dies at start or does not answer within
        ``limits.start_timeout_s``.
        """
        from jupyter_client.manager import AsyncKernelManager

        if spec.program is not None:
            raise UsageError("a Jupyter kernel runs its kernelspec's program, not another")
        request = LaunchRequest(
            backend=self._sandbox(),
            limits=spec.limits,
            nonce=spec.nonce,
            env=spec.env,
            mounts=spec.mounts,
            network=spec.network,
            attach=self.python,
            python=sys.executable,
        )
        token = expect(request)
        manager = AsyncKernelManager(kernel_name=self.kernel_name, transport="ipc")
        # every socket of this kernel's manager and client refuses a message over the cap
        # (libzmq drops the connection): a hostile kernel cannot make the host decode a
        # gigabyte; an honest one sends at most about max_output_bytes (streamcap) or a
        # display item of max_display_bytes (base64) in one message
        cap = max_message_bytes(spec.limits)
        manager.context.setsockopt(zmq.MAXMSGSIZE, cap)
        kernelspec = manager.kernel_spec
        if kernelspec is None:
            raise KernelStartError(f"the kernelspec {self.kernel_name!r} could not be read")
        kernelspec.metadata = {
            **(kernelspec.metadata or {}),
            "kernel_provisioner": {"provisioner_name": NAME, "config": {"request_id": token}},
        }
        client = None
        try:
            await manager.start_kernel()
            assert request.proc is not None
            assert request.sock is not None
            assert request.ipc_dir is not None
            client = manager.client()
            client.context.setsockopt(zmq.MAXMSGSIZE, cap)  # the client has a context of its own
            client.start_channels()
            info = await self._ready(client, request.proc, spec.limits.start_timeout_s)
            seal_ipc_dir(request.ipc_dir)
        except BaseException as exc:
            detail = ""
            if request.proc is not None:
                from sunroom.sandbox.launch import failure_detail

                detail = await failure_detail(request.proc)
                await request.proc.kill()
            if request.sock is not None:
                request.sock.close()
            await close_quietly(manager, client)
            if isinstance(exc, KernelStartError | UsageError | asyncio.CancelledError):
                if detail and isinstance(exc, KernelStartError):
                    raise KernelStartError(f"{exc}{detail}") from exc
                raise
            if isinstance(exc, SandboxUnavailableError):
                raise
            raise KernelStartError(
                f"the Jupyter kernel {self.kernel_name!r} did not start: {exc}{detail}"
            ) from exc
        finally:
            forget(token)
        proc = JupyterProcess(
            request.proc,
            manager,
            client,
            kernel_name=self.kernel_name,
            python=self.python,
            info=info,
        )
        return proc, request.sock

    async def _ready(self, client: Any, proc: KernelProcess, timeout_s: float) -> dict[str, Any]:
        """Ask for ``kernel_info`` until answered and seen on IOPub; the reply's content.

        IOPub is a ZeroMQ PUB/SUB pair: what the kernel publishes before the subscription has
        reached it is lost, so a first cell could lose its output. The kernel is ready once a
        ``kernel_info`` request's status message has arrived on IOPub as well. Raises
        KernelStartError when the kernel dies first or the time is up.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        info: dict[str, Any] | None = None
        while True:
            if not proc.alive():
                why = await proc.exit_reason()
                raise KernelStartError(
                    f"the Jupyter kernel {self.kernel_name!r} did not start: it ended ({why})"
                )
            left = deadline - loop.time()
            if left <= 0:
                raise KernelStartError(
                    f"the Jupyter kernel {self.kernel_name!r} did not start: it did not answer "
                    f"kernel_info within {timeout_s:g} s"
                )
            msg_id = client.kernel_info()
            session = client.session
            try:  # messages are checked (the messages module); malformed ones are skipped
                while info is None:
                    reply = await receive(client.shell_channel.socket, session, min(0.5, left))
                    if reply is not None and reply.parent_id == msg_id:
                        info = reply.content
                while True:  # the request's status on IOPub: the subscription is live
                    msg = await receive(client.iopub_channel.socket, session, min(0.2, left))
                    if msg is not None and msg.parent_id == msg_id:
                        return info
            except TimeoutError:  # no answer yet: ask again (a kernel may miss the first request)
                continue
