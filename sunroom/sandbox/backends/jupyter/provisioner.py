"""sunroom's kernel provisioner: jupyter-client's launch seam, backed by sunroom's sandboxes.

Registered as the ``sunroom-provisioner`` entry point of ``jupyter_client.kernel_provisioners``.
A kernel manager whose kernelspec names it (:class:`~.backend.JupyterBackend`
sets that on the spec it starts) hands it the kernelspec's argv; the provisioner launches it
through a sunroom backend (``subprocess``, ``bwrap`` or ``docker``) as an
:class:`~sunroom.sandbox.backend.ExecSpec`: under sunroom's supervisor, inside the sandbox, with
sunroom's limits, so isolation, limits and reaping hold exactly as for sunroom's own kernels.

The kernel talks ZeroMQ over the ``ipc`` transport: five Unix sockets in the kernel's IPC
directory (a private directory of the kernel's run dir, bound into the sandbox), so a kernel
with no network namespace still reaches its client. The connection key is the kernel
manager's own (random per kernel); it is written only to the kernel's connection file (which
only the kernel's uid and root can read) and the manager's (mode 0600, in the run dir, which
the kernel cannot list), and never logged.

The launch itself needs live objects (the backend, the limits, the sunroom channel that comes
back), which cannot travel through a kernelspec's JSON: :func:`expect` files a
:class:`LaunchRequest` under a random id, the kernelspec's provisioner config names that id,
and :meth:`SunroomProvisioner.launch_kernel` fills the request in.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Unicode

from sunroom.errors import KernelStartError
from sunroom.sandbox.backend import (
    IPC_TOKEN,
    PYTHON_TOKEN,
    Backend,
    ExecSpec,
    InputMount,
    KernelProcess,
    LaunchSpec,
)
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import Egress

NAME = "sunroom-provisioner"
"""The entry point name a kernelspec's ``metadata.kernel_provisioner`` names."""
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
"""With ``ipc``, a "port" only numbers a socket file: ``<ip>-<port>``."""
SOCKET_STEM = "k"
KERNEL_FILE = "kernel.json"
HOST_FILE = "jupyter-host.json"
EXTENSION = "sunroom.prelude.ipython"
JUPYTER_MAIN = "sunroom.prelude.jupyter_main"
PRIVATE_TMP_BACKENDS = frozenset({"bwrap", "docker"})
"""Sandboxes whose ``/tmp`` is the kernel's own (size-capped): IPython keeps its profile there."""
PYTHON_NAMES = frozenset({"python", "python3", "python3.11", "python3.12", "python3.13"})


@dataclass(eq=False)
class LaunchRequest:
    """One launch the provisioner is to make, and (after it) what came back."""

    backend: Backend
    limits: Limits
    nonce: str
    env: Mapping[str, str]
    mounts: tuple[InputMount, ...]
    network: Egress | None
    attach: bool
    python: str
    """The interpreter that runs sunroom (an argv[0] naming it becomes the backend's own)."""
    proc: KernelProcess | None = None
    sock: socket.socket | None = None
    ipc_dir: Path | None = field(default=None)


_REQUESTS: dict[str, LaunchRequest] = {}


def expect(request: LaunchRequest) -> str:
    """File *request* for the provisioner; return the id its kernelspec config names."""
    token = secrets.token_hex(12)
    _REQUESTS[token] = request
    return token


def forget(token: str) -> None:
    """Drop the request filed under *token* (after the launch, whatever happened)."""
    _REQUESTS.pop(token, None)


def kernel_argv(argv: list[str], *, python: str, attach: bool) -> tuple[str, ...]:
    """The kernelspec's argv as the sandbox runs it.

    ``{connection_file}`` becomes the kernel's connection file in its IPC directory; an
    ``argv[0]`` that names a bare Python (``python``, ``python3``) or sunroom's own interpreter
    becomes the backend's interpreter, and a module it runs (``-m ipykernel_launcher``) is
    run through :mod:`sunroom.prelude.jupyter_main`; with *attach*, the sunroom extension is
    loaded.
    """
    out = [a.replace("{connection_file}", f"{IPC_TOKEN}/{KERNEL_FILE}") for a in argv]
    if out and (out[0] in PYTHON_NAMES or out[0] == python):
        out[0] = PYTHON_TOKEN
    if len(out) > 2 and out[0] == PYTHON_TOKEN and out[1] == "-m":  # see jupyter_main
        out[2:2] = [JUPYTER_MAIN]
    if attach:  # and no history database in the workdir: each kernel's history is its own
        out.append(f"--IPKernelApp.extra_extensions={EXTENSION}")  # added to a config's own
        out.append("--HistoryManager.enabled=False")
    return tuple(out)


class SunroomProvisioner(KernelProvisionerBase):
    """Launches a kernelspec's program through a sunroom backend (see the module docstring)."""

    request_id = Unicode("", config=True, help="the id of the LaunchRequest to carry out")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._request: LaunchRequest | None = None

    # -- the process ------------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        """Whether a kernel was launched and is still running."""
        request = self._request
        return request is not None and request.proc is not None and request.proc.alive()

    async def poll(self) -> int | None:
        """None while the kernel runs, else an exit code (1: sunroom does not report one)."""
        return None if self.has_process else 1

    async def wait(self) -> int | None:
        """Wait until the kernel has ended."""
        while self.has_process:  # noqa: ASYNC110 - the tree gives no event to wait on
            await asyncio.sleep(0.05)
        return 1

    async def send_signal(self, signum: int) -> None:
        """SIGINT interrupts the kernel (from outside the sandbox); any other signal kills it."""
        request = self._request
        if request is None or request.proc is None:
            return
        if signum == signal.SIGINT:
            request.proc.interrupt()
        elif signum:
            await request.proc.kill()

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel's whole process tree."""
        if self._request is not None and self._request.proc is not None:
            await self._request.proc.kill()

    async def terminate(self, restart: bool = False) -> None:
        """As :meth:`kill`: the supervisor's sweep is the only polite ending there is."""
        await self.kill(restart)

    async def cleanup(self, restart: bool = False) -> None:
        """Nothing of its own: the kernel's run dir goes with its process tree."""

    # -- the launch -------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Find the request; build the command. The host's environment is never passed on."""
        request = _REQUESTS.get(self.request_id)
        if request is None:
            raise KernelStartError(
                "the sunroom provisioner was started without a launch request; start Jupyter "
                "kernels through sunroom (backend='jupyter'), not with this provisioner directly"
            )
        self._request = request
        argv = [str(a) for a in self.kernel_spec.argv]
        kwargs.pop("extra_arguments", None)
        kwargs["cmd"] = list(kernel_argv(argv, python=request.python, attach=request.attach))
        kwargs["env"] = {str(k): str(v) for k, v in (self.kernel_spec.env or {}).items()}
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Launch *cmd* in the request's sandbox; return the host side's connection info."""
        request = self._request
        assert request is not None, "pre_launch runs first"
        km: Any = self.parent
        assert km is not None, "a kernel manager made this provisioner"
        key: bytes = km.session.key
        kernel_info = {
            **PORTS,
            "ip": f"{IPC_TOKEN}/{SOCKET_STEM}",
            "key": key.decode(),
            "transport": "ipc",
            "signature_scheme": km.session.signature_scheme,
            "kernel_name": km.kernel_name,
        }
        env = {**request.env, **kwargs.get("env", {})}
        if request.attach:  # the extension caps stream messages in the kernel (streamcap)
            env["SUNROOM_MAX_OUTPUT_BYTES"] = str(request.limits.max_output_bytes)
        if request.backend.name in PRIVATE_TMP_BACKENDS:  # IPython's profile, out of the workdir
            env.setdefault("IPYTHONDIR", "/tmp/.ipython")
        program = ExecSpec(
            argv=tuple(cmd),
            files={KERNEL_FILE: json.dumps(kernel_info)},
            attach=request.attach,
        )
        spec = LaunchSpec(
            limits=request.limits,
            nonce=request.nonce,
            env=env,
            mounts=request.mounts,
            program=program,
            network=request.network,
        )
        proc, sock = await request.backend.launch(spec)
        ipc_dir = proc.ipc_dir
        if ipc_dir is None:
            sock.close()
            await proc.kill()
            raise KernelStartError(
                f"the {request.backend.name} backend gave the Jupyter kernel no IPC directory"
            )
        request.proc, request.sock, request.ipc_dir = proc, sock, ipc_dir
        km.connection_file = str(ipc_dir.parent / HOST_FILE)
        self.connection_info = {
            "shell_port": PORTS["shell_port"],
            "iopub_port": PORTS["iopub_port"],
            "stdin_port": PORTS["stdin_port"],
            "control_port": PORTS["control_port"],
            "hb_port": PORTS["hb_port"],
            "ip": str(ipc_dir / SOCKET_STEM),
            "key": key,  # type: ignore[typeddict-item]  # bytes at run time, as the manager holds it
            "transport": "ipc",
            "signature_scheme": km.session.signature_scheme,
            "kernel_name": km.kernel_name,
        }
        return self.connection_info
