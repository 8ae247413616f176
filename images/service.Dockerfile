# syntax=docker/dockerfile:1
# The sunroom service image: `sunroom serve` with its web framework, the PostgreSQL store, OTLP
# traces, the model providers and the Docker SDK, plus bubblewrap for the bwrap backend.
#
#   docker build -f images/service.Dockerfile -t sunroom-service:latest .
#   docker compose up                                    # docker-compose.yml: docker backend
#   docker compose -f deploy/compose/replicas.yaml up    # two replicas over PostgreSQL
#   kubectl apply -k deploy/k8s                          # docs/deploy.md
#
# Needs the python:3.11-slim base from a registry (not available on our machines).

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# bubblewrap and libseccomp for the bwrap backend (docs/security.md); util-linux has setpriv
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap libseccomp2 util-linux \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/sunroom-service
COPY pyproject.toml README.md ./
COPY sunroom/ sunroom/
# gcc and libc6-dev only while the install compiles the kernels' watcher (setup.py)
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-cache-dir ".[service,postgres,otel,providers,docker]" \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* /opt/sunroom-service/sunroom /opt/sunroom-service/build
# The service runs as root inside its container: the bwrap backend leases an unprivileged uid to
# each kernel (docs/security.md), and the docker backend drives the Docker socket (root-equivalent
# anyway) and hands each kernel's socket directory to the kernel uid (chown).
WORKDIR /
EXPOSE 8765
CMD ["python", "-m", "sunroom.cli", "serve", "--host", "0.0.0.0", "--expose"]
