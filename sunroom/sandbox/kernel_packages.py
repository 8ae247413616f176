"""A kernel's packages: :meth:`install` into its site dir and :meth:`list_packages`.

pip runs inside the kernel's sandbox from the wheelhouse or index of the kernel's
:class:`~sunroom.Packages`; see :mod:`sunroom.sandbox.packages` and docs/packages.md.
"""

from __future__ import annotations

from typing import Any

from sunroom.errors import ClosedError, KernelError, PackageInstallError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox.kernel_lifecycle import KernelLifecycle
from sunroom.sandbox.packages import InstalledPackage, PackageListing, check_timeout, installed


class KernelPackages(KernelLifecycle):
    """Installs pip requirements in the kernel and lists what it can import."""

    async def install(
        self, *requirements: str, timeout_s: float | None = None
    ) -> list[InstalledPackage]:
        """Install pip *requirements* into the kernel's site dir, as ``install()`` in a cell.

        pip runs inside the kernel's sandbox (docs/packages.md) from the wheelhouse or index of
        :attr:`packages` (or the network, when the kernel has one); the import of every
        installed distribution is checked before this returns. Returns what was installed,
        dependencies included. Raises PackageInstallError with pip's reason (no such package,
        import failure, over ``max_bytes`` or ``timeout_s``, nowhere to look): the site dir is
        then as it was. UsageError for a bad requirement; KernelDiedError when the kernel dies
        meanwhile.
        """
        self._require_runtime("packages")
        params: dict[str, Any] = {"requirements": list(requirements)}
        if timeout_s is not None:
            params["timeout_s"] = check_timeout(timeout_s)
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                rows = await self._channel.call("install_packages", params, check=schema.packages)
            except RemoteError as exc:
                raise _install_error(exc) from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("install", exc) from None
        return installed(rows)

    async def list_packages(self) -> PackageListing:
        """The distributions importable in the kernel and where ``install()`` may look.

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        meanwhile.
        """
        self._require_runtime("packages")
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                raw = await self._channel.call("list_packages", check=schema.package_listing)
            except RemoteError as exc:
                raise KernelError(f"list_packages failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("list_packages", exc) from None
        return PackageListing(tuple(installed(raw["packages"])), tuple(raw["sources"]))


def _install_error(exc: RemoteError) -> Exception:
    """The host error for an ``install_packages`` error answer."""
    message = cut(exc.error.message, 2300)
    if exc.error.type == "PackageInstallError":
        return PackageInstallError(message)
    if exc.error.type in ("ValueError", "TypeError"):
        return UsageError(message)
    return KernelError(f"install failed: {exc.error.type}: {message}")
