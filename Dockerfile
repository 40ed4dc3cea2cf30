# llmfleet's control plane and reconciler: one image, two commands (ENTRYPOINT is `llmfleet`).
#
#   docker build -t llmfleet .
#   docker run --read-only --tmpfs /tmp -v llmfleet-state:/var/lib/llmfleet \
#     -v /etc/llmfleet:/etc/llmfleet:ro -p 8080:8080 llmfleet                   # serve (the default command)
#   docker run --read-only --tmpfs /tmp -v llmfleet-work:/var/lib/llmfleet --no-healthcheck \
#     -v /etc/llmfleet:/etc/llmfleet:ro llmfleet reconcile --once --config /etc/llmfleet/control-plane.yaml
#
# Runs as uid/gid 10001 (deploy/kubernetes runs it so), with a read-only root file system: the only
# writable paths are /var/lib/llmfleet (HOME, the git clones, an SQLite state file if you use one) and
# /tmp; mount a volume or a tmpfs (an emptyDir) on each. No secret is built in: the config and its
# ${cred:NAME} files are mounted at run time (CREDENTIALS_DIRECTORY). The release (.github/workflows/
# release.yml) publishes it as ghcr.io/<owner>/<repo>:<version>, the version of
# installer/llmfleet_contract/version.py. Linted with hadolint (tests/release/test_image.py).
#
# The base is pinned by tag (Python 3.11, Debian 12): no registry was reachable where this file was
# written to read its digest. Pin it by digest where you build (docker buildx imagetools inspect
# python:3.11-slim-bookworm), e.g. --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the wheel, then a virtual environment with it and its dependencies --------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY schemas/ schemas/
COPY fleet-repo-example/ fleet-repo-example/
COPY installer/ installer/
COPY gateway/ gateway/
COPY reconciler/ reconciler/
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
    && python -m venv /opt/llmfleet \
    && /opt/llmfleet/bin/pip install /dist/llmfleet-*.whl \
    && /opt/llmfleet/bin/pip uninstall -y -q pip

# --- runtime ------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmfleet" \
      org.opencontainers.image.description="llmfleet control plane and reconciler (llmfleet serve, llmfleet reconcile)" \
      org.opencontainers.image.licenses="Apache-2.0"
# git: GitPython runs it to clone and fetch the fleet repository. Debian's current stable package (no
# version pin: a pinned Debian version disappears from the archive at its next security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 llmfleet \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/llmfleet --shell /usr/sbin/nologin llmfleet \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/llmfleet \
    && install -d -m 0755 /etc/llmfleet
COPY --from=build /opt/llmfleet /opt/llmfleet
ENV PATH=/opt/llmfleet/bin:$PATH \
    HOME=/var/lib/llmfleet \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CREDENTIALS_DIRECTORY=/run/credentials/llmfleet \
    LLMFLEET_HEALTH_URL=http://127.0.0.1:8080/health
WORKDIR /var/lib/llmfleet
VOLUME ["/var/lib/llmfleet"]
USER 10001:10001
EXPOSE 8080
# GET /health: 200 once a valid commit is served (503 before). Python's urllib, as the base has no curl;
# a TLS listener (tls: in the config) is checked with LLMFLEET_HEALTH_URL=https://127.0.0.1:PORT/health,
# its certificate not verified (it is this container's own). Not for `reconcile` (--no-healthcheck).
HEALTHCHECK --interval=30s --timeout=5s --start-period=5m --retries=3 \
  CMD ["python", "-I", "-c", "import os, ssl, urllib.request; c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE; urllib.request.urlopen(os.environ['LLMFLEET_HEALTH_URL'], timeout=4, context=c).close()"]
ENTRYPOINT ["llmfleet"]
# Plain HTTP on all interfaces of the container: put TLS in front (an Ingress, a proxy), or give the
# config tls: {cert, key} (then --insecure-http has no effect).
CMD ["serve", "--config", "/etc/llmfleet/control-plane.yaml", "--listen", "0.0.0.0:8080", "--insecure-http"]
