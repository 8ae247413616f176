"""The docker backend's offline kernel image, built by the package (``sunroom docker-image``).

A wheel install has no ``scripts/docker-setup.sh``; the image builder is package code, so a user
of ``sunroom[docker]`` builds the image with one command and the setup script calls the same.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import uuid

import pytest

from sunroom import Kernel
from sunroom.sandbox.backends.docker import DockerBackend
from sunroom.sandbox.backends.docker_image import ROOTFS_LABEL, rootfs_tar
from tests.conftest import _require


def test_the_rootfs_is_deterministic_and_holds_only_users_and_mount_points() -> None:
    data = rootfs_tar()
    assert data == rootfs_tar()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        passwd = tar.extractfile(members["etc/passwd"])
        assert passwd is not None
        users = passwd.read().decode()
    assert users.startswith("sunroom:x:1000:1000:") and "root" not in users
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members.values())
    assert members["work"].mode == 0o700 and members["tmp"].mode == 0o1777
    files = {n for n, m in members.items() if m.isfile()}
    assert files == {"etc/passwd", "etc/group", "etc/nsswitch.conf"}
    for top in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{top}"):  # merged /usr: the same symlink
            assert members[top].issym() and members[top].linkname == os.readlink(f"/{top}")
        elif os.path.isdir(f"/{top}"):  # a real directory: an empty mount point
            assert members[top].isdir()


@pytest.mark.kernel
def test_sunroom_docker_image_builds_an_image_kernels_run_in() -> None:
    _require("docker")
    import docker  # type: ignore[import-untyped, unused-ignore]

    tag = f"sunroom-kernel:test-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "sunroom.cli", "docker-image", "--tag", tag]
    try:
        first = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith(f"{tag}: built"), first.stdout
        again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert again.stdout.startswith(f"{tag}: up to date"), again.stdout
        client = docker.from_env()
        try:
            assert ROOTFS_LABEL in client.images.get(tag).labels
        finally:
            client.close()
        with Kernel(backend=DockerBackend(image=tag)) as k:
            r = k.execute("import msgpack, sunroom; 6 * 7")
        assert r.ok and r.value == "42", r
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
