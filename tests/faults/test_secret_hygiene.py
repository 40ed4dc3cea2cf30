"""Secret hygiene over the whole loop, with known secret values.

Real parts: a fleet git repository; `fleetllm serve` as a process (fleet key, salt, legacy key, admin
and viewer tokens, webhook secret, a provider key, the LiteLLM master key: all as ${env:} references);
a box on 127.0.0.6 provisioned by installer/fleetllm_installer/provision/vast.sh (installer download, config fetch, real
supervisord running the stub vLLM with its bearer, report back), one of its servers a legacy pair
with the legacy key; `fleetllm plan` and `fleetllm apply` against the real LiteLLM (the fake of its
API without one); requests that fail on purpose (wrong keys and tokens, unknown box, bad report, bad
webhook signature, a LiteLLM that refuses the master key).

Then every secret and every derived bearer is looked for in: every log line (control plane,
reconciler, installer, supervisord, every program log), every answer an operator can see (/health,
/metrics, the admin JSON, every error answer), every file written under the test's directory but the
Supervisor program files (which hold VLLM_API_KEY by design), the state database included, and the
command line of every process on the machine. None may appear anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetllm.core.fleet.bearer import Salt
from tests.conftest import git
from tests.installer.realprocs import http_status, wait_until
from tests.support.box import Box
from tests.support.litellm import LitellmProxy, proxy_from_env
from tests.support.plane import FLEETLLM, ControlPlane, free_port, request
from tests.support.ports import free_ports

from .conftest import ADMIN_TOKEN, FLEET_KEY, HOOK_SECRET, LEGACY_KEY, PLANE_ENV, SALT, VIEWER_TOKEN, plane_document

BOX = "127.0.0.6"
VAST_KEY = "vast-key-faults-Qx8Wm3Kp6Tz1"
WRONG_MASTER = "sk-wrong-master-faults-Ue4Rb7"
pytestmark = pytest.mark.slow


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(BOX, tmp_path / "box")
    try:
        yield made
    finally:
        made.stop()


def write_fleet(repo: Path, p1: int, p2: int) -> None:
    (repo / "fleet.yaml").write_text(
        f"version: 1\nfleet_id: test-fleet\nlisten_ports: [{p1}]\nlegacy_servers:\n  - {{host: '{BOX}', port: {p2}}}\n"
        "reconcile: {probe_timeout_s: 2, up_after_successes: 1, max_delete_fraction: 1.0}\n")
    (repo / "models.yaml").write_text(
        "models:\n  tiny-a:\n    vllm: {model: org/tiny-a, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n"
        "  tiny-b:\n    vllm: {model: org/tiny-b, max_model_len: 4096, vram_gb: 2, disk_gb: 1}\n")
    (repo / "placement.yaml").write_text(
        f"hosts:\n  '{BOX}':\n    provider: static\n    servers:\n      - [tiny-a, {p1}]\n      - [tiny-b, {p2}]\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one box, one legacy pair")


def cmdlines() -> list[str]:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_no_secret_anywhere(tmp_path: Path, upstream: LitellmProxy, box: Box,
                            start_plane: Callable[..., ControlPlane], figures: Callable[..., None]) -> None:
    p1, p2 = free_ports(BOX, BOX)
    repo = tmp_path / "fleet"
    repo.mkdir()
    write_fleet(repo, p1, p2)
    salt = Salt(SALT)
    bearers = {f"bearer {BOX}:{p1}": salt.derive(BOX, p1), f"bearer {BOX}:{p2} (salted, unused)": salt.derive(BOX, p2)}
    secrets = {"fleet key": FLEET_KEY, "salt": SALT, "legacy key": LEGACY_KEY, "admin token": ADMIN_TOKEN,
               "viewer token": VIEWER_TOKEN, "webhook secret": HOOK_SECRET, "vast key": VAST_KEY,
               "master key": upstream.master_key, "wrong master key": WRONG_MASTER, **bearers}
    vast = free_port()  # a provider key in the config, for a provider no box uses: read, never sent
    document = plane_document(tmp_path / "state", repo_path=repo, refresh_interval_s=1,
                              litellm={"url": upstream.url, "master_key": "${env:MASTER}"},
                              providers={"static": {}, "vast": {"api_key": "${env:VAST}",
                                                                "url": f"http://127.0.0.1:{vast}"}})
    plane = start_plane(document, env={"MASTER": upstream.master_key, "VAST": VAST_KEY})
    seen: dict[str, bytes] = {}  # what an operator sees, by where

    # The box boots: installer download, config fetch, supervisord starts both stubs, report back.
    done = box.provision(plane.url, FLEET_KEY)
    seen["provisioning output"] = (done.stdout + done.stderr).encode()
    assert done.returncode == 0, done.stderr
    wait_until("both stubs serving", lambda: http_status(f"http://{BOX}:{p1}/health") == 200
               and http_status(f"http://{BOX}:{p2}/health") == 200, 90)

    # The reconciler: plan, apply (with a metrics file), plan again; once with a wrong master key.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **PLANE_ENV, "MASTER": upstream.master_key,
           "VAST": VAST_KEY}

    def fleetllm(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FLEETLLM), *args, "--config", str(config)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180, check=False)

    for args in (("plan",), ("apply", "--yes", "--metrics-file", str(tmp_path / "reconcile.prom")), ("plan",)):
        run = fleetllm(plane.config, *args)
        seen[f"fleetllm {args[0]} output"] = (run.stdout + run.stderr).encode()
        assert run.returncode == 0, run.stdout + run.stderr
    managed = {r["model_info"]["id"] for r in upstream.deployments() if r["model_info"].get("managed_by")}
    assert managed == {f"fleetllm:{BOX}:{p1}", f"fleetllm:{BOX}:{p2}"}
    wrong = tmp_path / "wrong-master.yaml"
    wrong.write_text(plane.config.read_text().replace("${env:MASTER}", "${env:WRONG_MASTER}"))
    env["WRONG_MASTER"] = WRONG_MASTER
    refused = fleetllm(wrong, "plan")
    seen["fleetllm plan with a refused master key"] = (refused.stdout + refused.stderr).encode()
    assert refused.returncode == 1 and "401" in refused.stdout + refused.stderr

    # Requests that fail on purpose, and every operator view.
    box_get = {"X-LLMAO-Host": BOX}
    box_report = {**box_get, "Authorization": f"Bearer {FLEET_KEY}", "X-Fleetllm-Report-Key": Salt(SALT).report_key(BOX)}
    asks: dict[str, tuple[str, str, dict[str, str], bytes | None]] = {
        "config, wrong key": ("GET", "/vllm/config", {**box_get, "Authorization": f"Bearer {FLEET_KEY}x"}, None),
        "config, unknown box": ("GET", "/vllm/config", {"X-LLMAO-Host": "203.0.113.250",
                                                        "Authorization": f"Bearer {FLEET_KEY}"}, None),
        "installer, no key": ("GET", "/vllm/installer", box_get, None),
        "report, bad JSON": ("POST", "/vllm/report", box_report,
                             f'{{"api_key": "{bearers[f"bearer {BOX}:{p1}"]}", "x": '.encode()),
        "report, wrong shape": ("POST", "/vllm/report", box_report,
                                json.dumps({"revision": FLEET_KEY, "secret": SALT}).encode()),
        "admin, viewer token": ("POST", "/admin/approve", {"Authorization": f"Bearer {VIEWER_TOKEN}"}, b"{}"),
        "admin, bad approve": ("POST", "/admin/approve", {"Authorization": f"Bearer {ADMIN_TOKEN}",
                                                          "Content-Type": "application/json"},
                               json.dumps({"host": "203.0.113.251", "models": ["no-such-model"]}).encode()),
        "webhook, bad signature": ("POST", "/hooks/push", {"X-Hub-Signature-256": "sha256=" + HOOK_SECRET},
                                   b'{"ref": "refs/heads/main"}'),
        "health": ("GET", "/health", {}, None),
        "metrics": ("GET", "/metrics", {}, None),
        **{f"admin {view}": ("GET", f"/admin/{view}", {"Authorization": f"Bearer {VIEWER_TOKEN}"}, None)
           for view in ("attention", "reports", "fetches", "approvals", "control")},
        # the fleet controls (a reason that quotes a secret is the operator's words, kept: none here)
        **{f"control {action}": ("POST", f"/admin/{action}", {"Authorization": f"Bearer {ADMIN_TOKEN}",
                                                               "Content-Type": "application/json"},
                                 json.dumps({"reason": "hygiene"}).encode())
           for action in ("suspend", "resume", "sync", "unpin")},
        "control, bad pin": ("POST", "/admin/pin", {"Authorization": f"Bearer {ADMIN_TOKEN}",
                                                    "Content-Type": "application/json"},
                             json.dumps({"revision": "0123456789abcdef"}).encode()),
        "no such page": ("GET", f"/{FLEET_KEY}", {}, None),
    }
    statuses = {}
    for name, (method, path, headers, body) in asks.items():
        status, answer_headers, answer = request(plane.url + path, headers, method, body)
        statuses[name] = status
        seen[f"answer: {name}"] = json.dumps(answer_headers).encode() + b"\n" + answer
    assert statuses["config, wrong key"] == 403 and statuses["report, bad JSON"] == 400
    assert statuses["admin, viewer token"] == 403 and statuses["webhook, bad signature"] == 403
    reports = json.loads(seen["answer: admin reports"].split(b"\n", 1)[1])
    assert reports["boxes"][BOX]["outcome"] == "installed"  # the box's report is there, and was checked

    # Every process command line, while everything runs.
    seen["command lines"] = "\n".join(cmdlines()).encode()
    assert plane.stop() == 0  # flushes the buffered log and fetch records
    box.stop()

    # Every file written (logs, state database, reconciler metrics, the box's data dir, ...), but the
    # Supervisor program files, which carry VLLM_API_KEY by design.
    units = sorted((tmp_path / "box" / "conf.d").glob("fleetllm-*.conf"))
    servers = [u for u in units if u.name != "fleetllm-agent.conf"]  # the box agent's program holds no bearer
    assert servers and all(bearers[f"bearer {BOX}:{p1}"] in u.read_text() or LEGACY_KEY in u.read_text()
                           for u in servers)
    assert (tmp_path / "box" / "conf.d" / "fleetllm-agent.conf") in units  # the box has its agent...
    assert FLEET_KEY not in (tmp_path / "box" / "conf.d" / "fleetllm-agent.conf").read_text()  # ...without the key
    # The box agent's own copy of the fleet key (it fetches with it): the one place it may be, owner-only
    key_file = tmp_path / "box" / "data" / "fleetllm" / "agent" / "credentials" / "fleet-key"
    assert key_file.read_text().strip() == FLEET_KEY and key_file.stat().st_mode & 0o077 == 0
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p not in units and ".git" not in p.parts
             and p != key_file]
    for path in files:
        seen[f"file {path.relative_to(tmp_path)}"] = path.read_bytes()
    assert any(p.name == "state.sqlite3" for p in files) and any(p.suffix == ".log" for p in files)

    leaks = [f"{what} in {where}" for where, data in seen.items() for what, value in secrets.items()
             if value.encode() in data]
    assert leaks == []
    figures(case="secret hygiene", secrets=len(secrets), places=len(seen),
            files=sorted(str(p.relative_to(tmp_path)) for p in files),
            answers=len(asks), processes=seen["command lines"].count(b"\n") + 1,
            upstream="real LiteLLM" if proxy_from_env() else "fake")
