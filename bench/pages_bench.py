"""How long the status pages and their API take over a large fleet (docs/status-pages.md).

    .venv/bin/python bench/pages_bench.py [--boxes 1000] [--rounds 5]

Builds bench/fleetgen's repository of `--boxes` boxes (3 servers each) in a temp git repo, starts the
control plane's runtime on it, fills its SQLite state store as a running fleet would (a config fetch
and a report per box with the digests it applied, and a pass record judging every server, 5% of the
boxes Stale and 5% Foreign, so `show=problems` lists 10% of them), then times
each page and API call through the real Flask app (its test client: no network), median of `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fleetgen import write_fleet
from fleetllm.adapters.state.passes import PassRecord, ServerRecord
from fleetllm.adapters.state.records import BoxApi, FetchRecord
from fleetllm.core.boxreport import BoxReport
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.server.app import create_app
from fleetllm.server.runtime import start_up
from fleetllm.settings import load_config
from fleetllm_contract.report import ReportOutcome

TOKEN = "bench-viewer-token-0123456789"
ENV = {"SALT": "bench-salt-0123456789abcdef", "VIEWER": TOKEN, "FLEET_KEY": "bench-fleet-key-0123"}
PATHS = ("/api/fleet", "/api/fleet?show=problems", "/api/models", "/api/attention", "/api/passes", "/", "/?fragment=1",
         "/?show=problems&fragment=1", "/models", "/history")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid",
                        "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetllm-pages-bench-") as tmp:
        root = Path(tmp)
        repo = write_fleet(root / "fleet", args.boxes)
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "bench fleet")
        (root / "cp.yaml").write_text(
            f"repo: {{path: {repo}, branch: main}}\n"
            "secrets: {vllm_api_salt: '${env:SALT}', fleet_key: '${env:FLEET_KEY}'}\n"
            f"state: {{url: 'sqlite:///{root / 'state.db'}'}}\n"
            "viewer_tokens: ['${env:VIEWER}']\n"
            "litellm: {url: 'http://127.0.0.1:9', master_key: '${env:FLEET_KEY}'}\n")
        started = time.perf_counter()
        runtime = start_up(load_config(root / "cp.yaml", env=ENV))
        served = runtime.tracker.served
        assert served is not None
        now = time.time()
        servers = []
        for n, (name, box) in enumerate(sorted(served.fleet.boxes.items())):
            runtime.store.record_fetch(FetchRecord(now - 60, BoxApi.CONFIG, 200, name, name, None, name,
                                                   served.revision))
            rendered = json.loads(served.boxes[name].body)["servers"]
            applied = [{"name": s["name"], "digest": s["digest"]} for s in rendered]
            runtime.store.record_report(BoxReport(name, now - 50, name, served.revision, "0.1.0",
                                                  ReportOutcome.INSTALLED,
                                                  freeze_mapping({"fit": {"ok": True}, "servers": applied})), 20)
            for row in box.servers:
                verdict = "Stale" if n % 20 == 3 else "Foreign" if n % 20 == 7 else "Healthy"
                servers.append(ServerRecord(name, row.port, row.name, row.model, verdict, f"{verdict} (bench)",
                                            f"{name}:{row.port}", 32768, 32768, verdict != "Foreign"))
        runtime.store.record_pass(PassRecord(now - 30, 12.0, served.revision, "apply", {"Healthy": len(servers)},
                                             servers=tuple(servers)))
        runtime.store.last_config_served()  # write out the buffered fetch log
        print(f"{args.boxes} boxes, {len(servers)} servers; set-up {time.perf_counter() - started:.1f} s")
        client = create_app(runtime).test_client()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        login = client.get("/login")
        csrf = login.get_data(as_text=True).split('name="csrf" value="', 1)[1].split('"', 1)[0]
        client.post("/login", data={"token": TOKEN, "csrf": csrf})
        for path in PATHS:
            times, size = [], 0
            for _ in range(args.rounds):
                begun = time.perf_counter()
                response = client.get(path, headers=headers if path.startswith("/api") else {})
                times.append(time.perf_counter() - begun)
                assert response.status_code == 200, (path, response.status_code)
                size = len(response.get_data())
            print(f"  GET {path:<16} median {statistics.median(times) * 1000:7.1f} ms  "
                  f"max {max(times) * 1000:7.1f} ms  {size / 1024:8.1f} KiB")
        runtime.stop()
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()), f"({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
