"""``sunroom docker-image``: build the docker backend's offline kernel image on this host.

No registry is needed: the image is a ``docker import`` of a small root filesystem of mount
points (:mod:`sunroom.sandbox.backends.docker_image`); building again is a no-op while nothing
changed. Needs ``sunroom[docker]`` and a running Docker daemon.
"""

from __future__ import annotations

from typing import Annotated

import typer

from sunroom.cli.support import fail
from sunroom.errors import SunroomError
from sunroom.extras import require

__all__ = ["docker_image_command"]


def docker_image_command(
    tag: Annotated[
        str, typer.Option(metavar="NAME:TAG", help="The image's tag (the backend's default).")
    ] = "sunroom-kernel:offline",
) -> None:
    """Build the offline kernel image the docker backend uses (no registry needed)."""
    try:
        require("docker", "sunroom docker-image")
        from sunroom.sandbox.backends.docker_image import build_offline_image

        build = build_offline_image(tag)
    except SunroomError as exc:
        raise fail(str(exc)) from None
    state = "built" if build.built else "up to date"
    typer.echo(f"{build.tag}: {state} (rootfs sha256 {build.rootfs_sha256[:12]})")
