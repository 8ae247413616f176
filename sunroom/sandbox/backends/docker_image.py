"""The docker backend's offline kernel image, built on this host with no registry.

The image (``sunroom-kernel:offline``, the backend's default) holds only ``/etc/passwd``,
``/etc/group``, ``/etc/nsswitch.conf`` and empty mount points: the backend bind-mounts the host's
``/usr``, the interpreter and the site-packages read-only (``docker_layout.py``). It is made by
``docker import`` of a small root filesystem tarball built here, so it needs nothing but a
running daemon. The tarball is deterministic (sorted names, mtime 0, owner root); its sha256 is
the image's ``sunroom.rootfs`` label, so building again is a no-op while nothing changed.

``sunroom docker-image`` and ``scripts/docker-setup.sh`` both call :func:`build_offline_image`.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from typing import Final

from sunroom.errors import SandboxUnavailableError
from sunroom.sandbox.backends.docker import DEFAULT_IMAGE, docker_sdk

__all__ = ["ImageBuild", "build_offline_image", "rootfs_tar"]

ROOTFS_LABEL: Final = "sunroom.rootfs"
IMAGE_UID: Final = 1000
"""The image's default user; kernels run as the uid the backend leases for each."""
_TOPS: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Host top-level directories mirrored: a merged-/usr symlink stays a symlink, a real
directory becomes an empty mount point the backend binds read-only."""
_DIRS: Final = (
    "etc", "usr", "proc", "dev", "sys", "run", "run/sunroom", "home", "opt", "opt/sunroom",
    "opt/sunroom/python", "opt/sunroom/lib", "opt/sunroom/site",
)  # fmt: skip
_PASSWD: Final = (
    f"sunroom:x:{IMAGE_UID}:{IMAGE_UID}:sunroom kernel:/work:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP: Final = f"sunroom:x:{IMAGE_UID}:\nnogroup:x:65534:\n"
_NSSWITCH: Final = "passwd: files\ngroup: files\nhosts: files\n"


@dataclass(frozen=True)
class ImageBuild:
    """What :func:`build_offline_image` did: the tag, the rootfs digest, and whether it built."""

    tag: str
    rootfs_sha256: str
    built: bool


def _entry(
    name: str, kind: bytes, mode: int, *, target: str = "", size: int = 0
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"./{name}")
    info.type = kind
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.linkname = target
    info.size = size
    return info


def rootfs_tar() -> bytes:
    """The image's root filesystem as a deterministic tar (same host layout, same bytes)."""
    files = {"etc/passwd": _PASSWD, "etc/group": _GROUP, "etc/nsswitch.conf": _NSSWITCH}
    entries: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
    for d in _DIRS:
        entries[d] = (_entry(d, tarfile.DIRTYPE, 0o755), b"")
    # the runtime chmods a tmpfs mount point to the image directory's mode: keep /work private
    entries["work"] = (_entry("work", tarfile.DIRTYPE, 0o700), b"")
    entries["tmp"] = (_entry("tmp", tarfile.DIRTYPE, 0o1777), b"")
    for top in _TOPS:
        host = f"/{top}"
        if os.path.islink(host):
            link = _entry(top, tarfile.SYMTYPE, 0o777, target=os.readlink(host))
            entries[top] = (link, b"")
        elif os.path.isdir(host):
            entries[top] = (_entry(top, tarfile.DIRTYPE, 0o755), b"")
    for name, text in files.items():
        data = text.encode()
        entries[name] = (_entry(name, tarfile.REGTYPE, 0o644, size=len(data)), data)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_entry("", tarfile.DIRTYPE, 0o755))
        for name in sorted(entries):
            info, data = entries[name]
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def build_offline_image(tag: str = DEFAULT_IMAGE) -> ImageBuild:
    """Build (``docker import``) the offline kernel image as *tag*, unless it is up to date.

    Raises SandboxUnavailableError when the Docker SDK is missing or no daemon answers.
    """
    docker = docker_sdk()
    data = rootfs_tar()
    digest = hashlib.sha256(data).hexdigest()
    try:
        client = docker.from_env()
        try:
            try:
                labels = client.images.get(tag).labels or {}
            except docker.errors.ImageNotFound:
                labels = {}
            if labels.get(ROOTFS_LABEL) == digest:
                return ImageBuild(tag, digest, built=False)
            repository, _, version = tag.rpartition(":")
            if not repository or "/" in version:
                repository, version = tag, "latest"
            client.api.import_image_from_data(
                data, repository=repository, tag=version,
                changes=[
                    f"LABEL {ROOTFS_LABEL}={digest}", "LABEL sunroom.kernel.image=offline",
                    f"USER {IMAGE_UID}:{IMAGE_UID}", "WORKDIR /work",
                    'CMD ["/usr/bin/false"]',
                ],
            )  # fmt: skip
            if client.images.get(tag).labels.get(ROOTFS_LABEL) != digest:
                raise SandboxUnavailableError(f"docker import did not produce the image {tag}")
        finally:
            client.close()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailableError(
            f"cannot build the kernel image {tag}: the Docker daemon said {exc}; start dockerd "
            "(or systemctl start docker) and try again"
        ) from None
    return ImageBuild(tag, digest, built=True)
