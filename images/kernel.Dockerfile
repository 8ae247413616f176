# syntax=docker/dockerfile:1
# The production kernel image for the `docker` backend: Python, msgpack and the two packages a
# kernel imports (sunroom.rpc, sunroom.prelude) — nothing of the host, no sunroom host code.
#
#   docker build -f images/kernel.Dockerfile -t sunroom-kernel:latest .
#   DockerBackend(image="sunroom-kernel:latest", host_mounts=False)
#
# The contract the backend relies on with host_mounts=False:
#   * /usr/local/bin/python3 is the interpreter (started as `python3 -I -S`, so site-packages
#     are NOT on sys.path);
#   * /opt/sunroom/lib holds `sunroom` (``__init__``, ``rpc``, ``prelude``) and `msgpack`: the
#     backend puts exactly that directory on the kernel's sys.path;
#   * uid/gid 1000 (`sunroom`) exists; /work (mode 0700, the tmpfs workdir's mount point: the
#     runtime keeps the image directory's mode) and /run/sunroom (the socket mount) exist.
# Any other package a kernel should import goes into /opt/sunroom/lib too
# (`pip install --target /opt/sunroom/lib ...` in a derived image).
#
# This image needs the python:3.11-slim base from a registry, so it cannot be built on machines
# without one (ours): there, `bash scripts/docker-setup.sh` builds the offline image
# sunroom-kernel:offline instead (see docs/docker.md).

FROM python:3.11-slim AS build
# a C compiler for the kernels' watcher (sunroom/prelude/watch.c; docs/design.md, "The watcher")
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir --no-compile --target /opt/sunroom/lib "msgpack>=1.0.8"
COPY sunroom/__init__.py /opt/sunroom/lib/sunroom/__init__.py
COPY sunroom/rpc/ /opt/sunroom/lib/sunroom/rpc/
COPY sunroom/prelude/ /opt/sunroom/lib/sunroom/prelude/
# built here, as setup.py builds it into the wheel (watcher.py only builds; it leaves the image)
COPY sunroom/sandbox/watcher.py /opt/sunroom/lib/sunroom/sandbox/watcher.py
RUN python3 -I -c "import importlib.util as u; \
s = u.spec_from_file_location('watcher', '/opt/sunroom/lib/sunroom/sandbox/watcher.py'); \
m = u.module_from_spec(s); s.loader.exec_module(m); raise SystemExit(m.build_all(force=True))" \
 && rm -rf /opt/sunroom/lib/sunroom/sandbox
RUN find /opt/sunroom/lib -name '__pycache__' -prune -exec rm -rf {} + \
 && python3 -I -S -c "import sys; sys.path.insert(0, '/opt/sunroom/lib'); \
import sunroom.prelude.boot, msgpack, sunroom.prelude.supervisor, sunroom.prelude.runtime" \
 && python3 -m compileall -q /opt/sunroom/lib

FROM python:3.11-slim
RUN groupadd --gid 1000 sunroom \
 && useradd --uid 1000 --gid 1000 --home-dir /work --no-create-home --shell /usr/sbin/nologin sunroom \
 && install -d -m 0700 -o 1000 -g 1000 /work \
 && install -d -m 0755 /run/sunroom
COPY --from=build /opt/sunroom/lib /opt/sunroom/lib
LABEL org.opencontainers.image.title="sunroom kernel" \
      sunroom.kernel.image="production"
USER 1000:1000
WORKDIR /work
# The backend always gives the command (the supervisor); running the image bare does nothing.
CMD ["/usr/local/bin/python3", "-c", "print('sunroom kernel image: started by sunroom, not by hand')"]
