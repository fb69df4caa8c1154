# syntax=docker/dockerfile:1
# kvgate gateway image: `kvgate serve` as a non-root user on a pinned slim Python.
#
#   docker build -t kvgate:0.1.0 .
#   docker run --rm -p 8080:8080 -v $PWD/pods.json:/etc/kvgate/pods.json:ro \
#     kvgate:0.1.0 serve --pods /etc/kvgate/pods.json
#
# In Kubernetes the manifests in deploy/ run it with KVGATE_DISCOVERY=kubernetes.
# Pin the base by digest too (python:3.11.14-slim-bookworm@sha256:...) where the build
# can resolve it. tests/deploy/test_image.py runs this file's install step (build the wheel
# from exactly what is COPYed here, install it into a fresh venv, run kvgate).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# -- build: the kvgate wheel, then a venv with it and its runtime dependencies ---------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps caches and results out).
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY indexer ./indexer
COPY predictor ./predictor
COPY subscriber ./subscriber
COPY simulator ./simulator
COPY tokenization ./tokenization
COPY bench ./bench
# A C compiler for the index's compiled primitives (indexer/_native.c): the wheel carries
# the built extension, so the runtime stage needs none.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
# The venv gets no pip of its own: the base image's pip installs into it (--python).
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/kvgate \
 && python -m pip --python /opt/kvgate/bin/python install /wheels/kvgate-*.whl

# -- runtime: the venv only, no sources, no build tools ------------------------------------
FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kvgate" \
      org.opencontainers.image.description="KV-cache-aware gateway for vLLM and SGLang fleets" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify it (deploy/base uses 10001).
RUN groupadd --system --gid 10001 kvgate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvgate
COPY --from=build /opt/kvgate /opt/kvgate

ENV PATH=/opt/kvgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KVGATE_HOST=0.0.0.0 \
    KVGATE_PORT=8080
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080

# No curl in slim images: ask /health with the interpreter that runs the gateway.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('KVGATE_PORT', '8080') + '/health', timeout=3)"]

# SIGTERM (the default stop signal) makes uvicorn stop accepting and drain in-flight
# requests for KVGATE_DRAIN_TIMEOUT.
ENTRYPOINT ["kvgate"]
CMD ["serve"]
