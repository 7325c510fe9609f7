# The Crucible control plane (docker-compose.yml's replicas, migrate and worker services).
# Built by scripts/stack.sh (`make stack`), which first writes build/stack/requirements.txt
# (pyproject.toml's dependencies) and build/stack/ca.pem (this host's CA bundle, for PyPI
# behind an intercepting proxy; empty when the host has none). BASE_IMAGE is the local
# debootstrap base by default; any Debian 12 image works (e.g. debian:bookworm-slim).
ARG BASE_IMAGE=crucible/base:latest
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# Dependencies first: this layer is rebuilt only when the dependency list changes.
COPY build/stack/requirements.txt build/stack/ca.pem /tmp/stack/
RUN python3 -m venv /opt/venv \
 && if [ -s /tmp/stack/ca.pem ]; then export PIP_CERT=/tmp/stack/ca.pem; fi \
 && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check -q \
      -r /tmp/stack/requirements.txt "setuptools>=68" wheel \
 && rm -rf /tmp/stack

# Editable: the package runs from /app, so every data file the source tree has is there
# (tasks, sandbox_images and the supervisor's sources included).
COPY . /app
RUN /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check -q \
      --no-deps --no-build-isolation -e /app

ENV PATH=/opt/venv/bin:$PATH \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    CRUCIBLE_HOST=0.0.0.0 \
    CRUCIBLE_PORT=8000 \
    CRUCIBLE_TASKS_DIR=/app/tasks \
    CRUCIBLE_IMAGES_DIR=/app/sandbox_images
WORKDIR /app
EXPOSE 8000
CMD ["crucible", "serve"]
