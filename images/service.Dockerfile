# syntax=docker/dockerfile:1
# The sunroom service image: the sunroom package with its providers and the Docker SDK, talking to
# the host's Docker daemon to start one kernel container per kernel (sunroom-kernel image).
#
#   docker build -f images/service.Dockerfile -t sunroom-service:latest .
#   docker compose up          # see docker-compose.yml: builds both images and wires them
#
# Needs the python:3.11-slim base from a registry (not available on our machines).

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/sunroom-service
COPY pyproject.toml README.md ./
COPY sunroom/ sunroom/
RUN pip install --no-cache-dir ".[providers]" "docker>=7" \
 && rm -rf /opt/sunroom-service/sunroom /opt/sunroom-service/build
# Kernels run in their own containers (the docker backend, configured by the SUNROOM_DOCKER_*
# variables in docker-compose.yml). The service runs as root inside its container because it
# drives the Docker socket (root-equivalent anyway) and hands each kernel's socket directory to
# the kernel uid (chown); it runs no model code itself.
WORKDIR /
# `sunroom serve` arrives with issue 6; until then the container runs the sunroom CLI entry point
# (`docker compose run service python -m sunroom.cli exec FILE.py` runs a file in a kernel).
CMD ["python", "-m", "sunroom.cli"]
