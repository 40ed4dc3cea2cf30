# fleetllm's control plane and reconciler: one image, two commands (ENTRYPOINT is `fleetllm`).
#
#   docker build -t fleetllm .
#   docker run --read-only --tmpfs /tmp -v fleetllm-state:/var/lib/fleetllm \
#     -v /etc/fleetllm:/etc/fleetllm:ro -p 8080:8080 fleetllm                   # serve (the default command)
#   docker run --read-only --tmpfs /tmp -v fleetllm-work:/var/lib/fleetllm --no-healthcheck \
#     -v /etc/fleetllm:/etc/fleetllm:ro fleetllm reconcile --once --config /etc/fleetllm/control-plane.yaml
#
# Runs as uid/gid 10001 (deploy/kubernetes runs it so), with a read-only root file system: the only
# writable paths are /var/lib/fleetllm (HOME, the git clones, an SQLite state file if you use one) and
# /tmp; mount a volume or a tmpfs (an emptyDir) on each. No secret is built in: the config and its
# ${cred:NAME} files are mounted at run time (CREDENTIALS_DIRECTORY). The release (.github/workflows/
# release.yml) publishes it as ghcr.io/<owner>/<repo>:<version>, the version of
# contract/fleetllm_contract/version.py. Linted with hadolint (tests/release/test_image.py).
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
COPY contract/ contract/
COPY installer/ installer/
COPY gateway/ gateway/
COPY reconciler/ reconciler/
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
    && python -m venv /opt/fleetllm \
    && /opt/fleetllm/bin/pip install /dist/fleetllm-*.whl \
    && /opt/fleetllm/bin/pip uninstall -y -q pip

# --- gateway-native: the box gateway's compiled builds, none by default -------------------------------
# The control plane serves boxes the builds of the gateway's request path (tools/build_gateway_native.py)
# from <sys.prefix>/share/fleetllm/gateway-native, one subdirectory per Python (docs/releasing.md). This
# stage holds none, so a plain `docker build .` makes an image whose boxes run the gateway's Python
# modules. The release puts its builds in instead with a named build context of the same name, which
# replaces this stage (BuildKit): --build-context gateway-native=DIR, where DIR/gateway-native/<tag>/ is
# each build. A stage with a shell rather than `scratch`, so the empty directory does not depend on how a
# builder treats WORKDIR there.
FROM ${PYTHON_IMAGE} AS gateway-native
RUN mkdir /gateway-native

# --- runtime ------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fleetllm" \
      org.opencontainers.image.description="fleetllm control plane and reconciler (fleetllm serve, fleetllm reconcile)" \
      org.opencontainers.image.licenses="Apache-2.0"
# git: GitPython runs it to clone and fetch the fleet repository. Debian's current stable package (no
# version pin: a pinned Debian version disappears from the archive at its next security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 fleetllm \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/fleetllm --shell /usr/sbin/nologin fleetllm \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/fleetllm \
    && install -d -m 0755 /etc/fleetllm
COPY --from=build /opt/fleetllm /opt/fleetllm
COPY --from=gateway-native /gateway-native/ /opt/fleetllm/share/fleetllm/gateway-native/
ENV PATH=/opt/fleetllm/bin:$PATH \
    HOME=/var/lib/fleetllm \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CREDENTIALS_DIRECTORY=/run/credentials/fleetllm \
    FLEETLLM_HEALTH_URL=http://127.0.0.1:8080/health
WORKDIR /var/lib/fleetllm
VOLUME ["/var/lib/fleetllm"]
USER 10001:10001
EXPOSE 8080
# GET /health: 200 once a valid commit is served (503 before). Python's urllib, as the base has no curl;
# a TLS listener (tls: in the config) is checked with FLEETLLM_HEALTH_URL=https://127.0.0.1:PORT/health,
# its certificate not verified (it is this container's own). Not for `reconcile` (--no-healthcheck).
HEALTHCHECK --interval=30s --timeout=5s --start-period=5m --retries=3 \
  CMD ["python", "-I", "-c", "import os, ssl, urllib.request; c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE; urllib.request.urlopen(os.environ['FLEETLLM_HEALTH_URL'], timeout=4, context=c).close()"]
ENTRYPOINT ["fleetllm"]
# Plain HTTP on all interfaces of the container: put TLS in front (an Ingress, a proxy), or give the
# config tls: {cert, key} (then --insecure-http has no effect).
CMD ["serve", "--config", "/etc/fleetllm/control-plane.yaml", "--listen", "0.0.0.0:8080", "--insecure-http"]
