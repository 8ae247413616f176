"""A kernel's packages: :meth:`install` into its site dir and :meth:`list_packages`.

pip runs inside the kernel's sandbox from the wheelhouse or index of the kernel's
:class:`~sunroom.Packages`; see :mod:`sunroom.sandbox.packages` and docs/packages.md.
"""

from __future__ import annotations

from typing import final

from sunroom.errors import ClosedError, KernelError, PackageInstallError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox.kernel_lifecycle import KernelCore
from sunroom.sandbox.packages import InstalledPackage, PackageListing, check_timeout, installed


@final
class KernelPackages:
    """Installs pip requirements in the kernel and lists what it can import."""

    def __init__(self, core: KernelCore) -> None:
        self._core = core

    async def install(
        self, *requirements: str, timeout_s: float | None = None
    ) -> list[InstalledPackage]:
        """Install into the kernel's site dir; see :meth:`AsyncKernel.install`."""
        core = self._core
        core.require_runtime("packages")
        params: dict[str, object] = {"requirements": list(requirements)}
        if timeout_s is not None:
            params["timeout_s"] = check_timeout(timeout_s)
        async with core.lock:
            await core.ensure()
            assert core.channel is not None
            try:
                rows = await core.channel.call("install_packages", params, check=schema.packages)
            except RemoteError as exc:
                raise _install_error(exc) from None
            except (ClosedError, ConnectionError) as exc:
                raise await core.died("install", exc) from None
        return installed(rows)

    async def list_packages(self) -> PackageListing:
        """What the kernel can import; see :meth:`AsyncKernel.list_packages`."""
        core = self._core
        core.require_runtime("packages")
        async with core.lock:
            await core.ensure()
            assert core.channel is not None
            try:
                raw = await core.channel.call("list_packages", check=schema.package_listing)
            except RemoteError as exc:
                raise KernelError(f"list_packages failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await core.died("list_packages", exc) from None
        return PackageListing(tuple(installed(raw["packages"])), tuple(raw["sources"]))


def _install_error(exc: RemoteError) -> Exception:
    """The host error for an ``install_packages`` error answer."""
    message = cut(exc.error.message, 2300)
    if exc.error.type == "PackageInstallError":
        return PackageInstallError(message)
    if exc.error.type in ("ValueError", "TypeError"):
        return UsageError(message)
    return KernelError(f"install failed: {exc.error.type}: {message}")
