# syntax=docker/dockerfile:1
#
# bleedwatch image: `docker build -t bleedwatch .`
#
#   docker run --rm -p 8400:8400 bleedwatch                  # embedded default (SQLite + in-process index)
#   docker run --rm -e BLEEDWATCH_DATABASE_URL=... bleedwatch migrate
#   docker run --rm -e BLEEDWATCH_DATABASE_URL=... bleedwatch keys create --name gw --role ingest
#
# Two stages: the builder makes the bleedwatch-sdk wheel (sdk/) and the bleedwatch wheel (hatchling,
# migrations force-included as service/migrations) and installs both with their dependencies into
# /opt/bleedwatch; the runtime stage copies only that virtualenv. Both stages use the same base so the venv's interpreter path matches.

ARG PYTHON_IMAGE=python:3.11-slim

# --------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/bleedwatch

WORKDIR /src

# Dependencies first, from the two pyproject.toml files alone, so editing the code does not
# reinstall them; with the `public` extra (licensedcode-data, about 170 MB installed) so
# `bleedwatch allowlist import-public` runs from the image. bleedwatch-sdk is not taken from an
# index: it is built from sdk/ below.
COPY pyproject.toml ./
COPY sdk/pyproject.toml ./sdk/
RUN python -c "import tomllib; \
p = tomllib.load(open('pyproject.toml', 'rb'))['project']; s = tomllib.load(open('sdk/pyproject.toml', 'rb'))['project']; \
print('\n'.join(d for d in p['dependencies'] + p['optional-dependencies']['public'] + s['dependencies'] \
                 if not d.startswith(s['name'])))" \
        > /tmp/requirements.txt \
 && /opt/bleedwatch/bin/pip install -r /tmp/requirements.txt

# The project: build the SDK's wheel (bleedwatch_sdk-*.whl, package `bleedwatch`) and the
# server's (bleedwatch_server-*.whl, package `service`), no deps (installed above), and install both.
COPY sdk ./sdk
COPY README.md ./
COPY service ./service
COPY migrations ./migrations
RUN pip wheel --no-deps --wheel-dir /wheels ./sdk . \
 && /opt/bleedwatch/bin/pip install /wheels/bleedwatch_sdk-*.whl /wheels/bleedwatch_server-*.whl \
 && /opt/bleedwatch/bin/pip check

# Fail the build if the installed package cannot find its migrations (`bleedwatch migrate` needs
# them). From / and with -I, /src is off sys.path: this checks the installed copy, not the source.
WORKDIR /
RUN /opt/bleedwatch/bin/python -I -c "\
import sys; from service.migrate import migrations_dir; d = migrations_dir(); print('migrations:', d); \
sys.exit(0 if str(d).startswith('/opt/bleedwatch/') and any((d / 'versions').glob('*.py')) else 1)"

# --------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="bleedwatch" \
      org.opencontainers.image.description="Catches one tenant's data in another tenant's LLM answers on shared inference, from keyed fingerprints only." \
      org.opencontainers.image.licenses="Apache-2.0"

# Fixed uid/gid so volume ownership and Kubernetes runAsUser/fsGroup are predictable.
ARG BLEEDWATCH_UID=10001
ARG BLEEDWATCH_GID=10001

# /var/lib/bleedwatch: the embedded default's SQLite file (unused once BLEEDWATCH_DATABASE_URL is set).
# No PROMETHEUS_MULTIPROC_DIR here: it would put every process of the image (worker, migration,
# kubectl exec) in prometheus-client's multiprocess mode. `bleedwatch serve` with several workers
# uses the directory it names (compose and the Kubernetes API pods mount one), or makes one in /tmp.
RUN groupadd --system --gid "${BLEEDWATCH_GID}" bleedwatch \
 && useradd --system --uid "${BLEEDWATCH_UID}" --gid bleedwatch --no-create-home \
        --home-dir /var/lib/bleedwatch --shell /usr/sbin/nologin bleedwatch \
 && install -d -o bleedwatch -g bleedwatch -m 0750 /var/lib/bleedwatch

COPY --from=builder /opt/bleedwatch /opt/bleedwatch

ENV PATH=/opt/bleedwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    BLEEDWATCH_HOST=0.0.0.0 \
    BLEEDWATCH_PORT=8400 \
    BLEEDWATCH_DATA_DIR=/var/lib/bleedwatch

WORKDIR /var/lib/bleedwatch
USER ${BLEEDWATCH_UID}:${BLEEDWATCH_GID}

EXPOSE 8400

# Liveness only (/readyz also checks Redis and the database). slim has no curl: use urllib.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('BLEEDWATCH_PORT', '8400'), timeout=4)"]

ENTRYPOINT ["bleedwatch"]
CMD ["serve"]
