#!/usr/bin/env bash
# fleetllm box provisioning for RunPod: the entrypoint of the fleetllm RunPod image (Dockerfile beside
# this file). Fetches the installer from the control plane, runs it, and becomes `supervisord -n`, the
# container's main process, which runs the vLLM servers and restarts them. (The installer's own
# `--handover exec` does the same for an image whose entrypoint is the installer itself; this script
# execs supervisord itself so that a failed install still leaves the container up.)
#
# Pod environment: FLEETLLM_URL and FLEETLLM_FLEET_KEY (or the legacy ASFQUART_URL and FLEET_KEY);
# optional FLEETLLM_INSTALLER_SHA256 (pin the installer) and FLEETLLM_CA_BUNDLE. RunPod sets
# RUNPOD_POD_ID, this box's name in placement.yaml. Arguments are passed on to the installer.
set -euo pipefail

# One line of the fleetllm log format (fleetllm_contract/logfmt.py, written out here: this script stands
# alone): JSON with ts, level, logger and event. `log [LEVEL] MESSAGE...` (LEVEL: info by default).
log() {
    local level=info
    case "${1:-}" in debug|info|warning|error|critical) level="$1"; shift ;; esac
    local event="$*"
    event="${event//\\/\\\\}"; event="${event//\"/\\\"}"; event="${event//[[:cntrl:]]/ }"
    printf '{"ts":"%s","level":"%s","logger":"fleetllm.provision","event":"%s"}\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)" "${level}" "${event}" >&2
}

export LLMAO_HOST="${LLMAO_HOST:-${RUNPOD_POD_ID:-}}"
export FLEETLLM_DATA_DIR="${FLEETLLM_DATA_DIR:-/workspace}"
PYTHON="${FLEETLLM_PYTHON:-python3}"
supervisor_args=(-n)
if [[ -n "${FLEETLLM_SUPERVISOR_CONFIG:-}" ]]; then
    supervisor_args+=(-c "${FLEETLLM_SUPERVISOR_CONFIG}")
fi

# When provisioning fails, keep the container up under supervisord (with the units of the last good
# install, if the disk kept them) rather than crash-looping: the reason is in this log and, when the
# control plane was reachable, in its box report.
fallback() {
    log error "$1; starting supervisord with the programs already installed"
    exec env -u FLEETLLM_FLEET_KEY -u FLEET_KEY supervisord "${supervisor_args[@]}"
}

if [[ -z "${LLMAO_HOST}" ]]; then
    fallback "RUNPOD_POD_ID is not set: is this a RunPod pod? (or set LLMAO_HOST)"
fi

installer="${FLEETLLM_DATA_DIR}/fleetllm/bin/fleetllm-box.pyz"
mkdir -p "$(dirname "${installer}")"

# Download GET /vllm/installer. Python, not curl: the fleet key stays in the environment and never
# appears on a command line (/proc/*/cmdline is world-readable). The Python below is the same, byte for
# byte, in vast.sh (tests/installer/test_provision.py checks it): each script must stand alone.
if ! "${PYTHON}" - "${installer}" "the pod's environment" <<'PY'
import hashlib, ipaddress, json, os, random, signal, ssl, sys, time, urllib.error, urllib.parse, urllib.request

def log(level, event):  # the fleetllm log format, as log() above writes it
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    print(json.dumps({"ts": stamp, "level": level, "logger": "fleetllm.provision", "event": event},
                     separators=(",", ":")), file=sys.stderr, flush=True)

def fail(event):
    log("error", event)
    sys.exit(1)

def first(*names):
    return next((os.environ[n].strip() for n in names if os.environ.get(n, "").strip()), "")

url, key = first("FLEETLLM_URL", "ASFQUART_URL").rstrip("/"), first("FLEETLLM_FLEET_KEY", "FLEET_KEY")
if not url or not key:
    fail(f"set FLEETLLM_URL and FLEETLLM_FLEET_KEY in {sys.argv[2]}")
def loopback(host):
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

parts = urllib.parse.urlsplit(url)
if parts.scheme != "https" and not (parts.scheme == "http" and loopback(parts.hostname or "")):
    fail(f"{url} must be https:// (plain http only to a loopback address)")
context = ssl.create_default_context(cafile=os.environ.get("FLEETLLM_CA_BUNDLE") or None)
# The fleet key never goes to a proxy in clear: plain http (loopback) uses none; https may use https_proxy
# (no_proxy respected), through a CONNECT tunnel that shows the proxy only the host and port.
proxies = {"https": urllib.request.getproxies()["https"]} if parts.scheme == "https" and \
    urllib.request.getproxies().get("https") else {}
class NoRedirect(urllib.request.HTTPRedirectHandler):  # a redirect is an error: it is never followed
    def redirect_request(self, *args):
        return None

opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies), NoRedirect(),
                                     urllib.request.HTTPSHandler(context=context))
request = urllib.request.Request(url + "/vllm/installer")
request.add_unredirected_header("Authorization", "Bearer " + key)
request.add_header("X-LLMAO-Host", os.environ["LLMAO_HOST"])
# Retried like the installer's own fetch (a control plane restarting while boxes boot): connection
# errors, timeouts, 429 and 5xx, with capped backoff and jitter, until FLEETLLM_FETCH_DEADLINE_S.
deadline = time.monotonic() + float(os.environ.get("FLEETLLM_FETCH_DEADLINE_S") or 600)

def too_slow(signum, frame):
    raise TimeoutError("no complete answer within the deadline of one request")

def shown(exc):  # what a server sent (a reason phrase, a status line) without the fleet key, printable, short
    return "".join(c if " " <= c <= "~" else "?" for c in str(exc).replace(key, "[fleet key]"))[:200]

def download():  # one request, bounded as a whole (a drip of a byte at a time cannot hold it)
    signal.setitimer(signal.ITIMER_REAL, max(5.0, min(60.0, deadline - time.monotonic())))
    try:
        with opener.open(request, timeout=60) as response:
            return response.read(), response.headers.get("X-Installer-SHA256", "")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

signal.signal(signal.SIGALRM, too_slow)
attempt = 0
while True:
    try:
        body, announced = download()
        break
    except Exception as exc:  # noqa: BLE001 - retried, or ends provisioning with its reason
        status = exc.code if isinstance(exc, urllib.error.HTTPError) else None
        untrusted = isinstance(getattr(exc, "reason", None), ssl.SSLCertVerificationError)
        delay = random.uniform(0, min(60.0, 2.0 ** attempt))
        attempt += 1
        if untrusted or (status is not None and status != 429 and status < 500) or time.monotonic() + delay > deadline:
            fail(f"cannot fetch {url}/vllm/installer: {shown(exc)} (gave up after {attempt} attempts)")
        log("warning", f"cannot fetch {url}/vllm/installer: {shown(exc)}; retrying in {delay:.1f} s")
        time.sleep(delay)
digest = hashlib.sha256(body).hexdigest()
pinned = os.environ.get("FLEETLLM_INSTALLER_SHA256", "").strip().lower()
for name, expected in (("FLEETLLM_INSTALLER_SHA256", pinned), ("X-Installer-SHA256", announced.strip().lower())):
    if expected and expected != digest:
        fail(f"installer sha256 {digest} does not match {name} {expected}")
temporary = sys.argv[1] + ".tmp"
with open(temporary, "wb") as handle:
    handle.write(body)
os.replace(temporary, sys.argv[1])
log("info", f"installer sha256 {digest}")
PY
then
    fallback "could not fetch the installer"
fi

log "running the installer for ${LLMAO_HOST}"
if ! "${PYTHON}" "${installer}" --handover none "$@"; then
    fallback "the installer failed"
fi
# Become supervisord (PID 1 of the container: every step execs the next), without the fleet key.
exec env -u FLEETLLM_FLEET_KEY -u FLEET_KEY supervisord "${supervisor_args[@]}"
