"""The benchmarks `make bench` runs still run: each script at a small size, end to end, every request it
makes answered as its figures assume. (One of them broke silently once: its figures were all refusals.)
No duration is asserted; docs/benchmarks.md holds the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_config_server_load_measures_every_variant_with_every_request_answered_200() -> None:
    out = run_bench("bench/config_server_load.py", "--boxes", "30", "--rounds", "2", "--seconds", "1",
                    "--concurrency", "4", "--variants", "cached,bare,floor,cached-wsgi", "--fetch-log-rows", "300")
    rounds = [line.split(None, 3) for line in out.splitlines() if line.startswith("round ")]
    assert sorted((r[1], r[2]) for r in rounds) == sorted((n, v) for n in ("1", "2")
                                                          for v in ("cached", "bare", "floor", "cached-wsgi"))
    for _, _, variant, figures in rounds:
        result = json.loads(figures)
        assert result["requests"] > 0 and result["errors"] == 0, (variant, result)
        assert result["statuses"] == {"200": result["requests"]}, (variant, result)
        assert result["server_cpu_us"] > 0, (variant, result)
    assert all(f"{pair}:" in out for pair in ("cached/bare", "cached/floor", "floor/bare", "cached/cached-wsgi"))
    assert "issue 28's target for cached" in out


def test_slow_clients_holds_its_connections_open_and_every_fetch_is_answered() -> None:
    result = json.loads(run_bench("bench/slow_clients.py", "--slow", "20", "--addresses", "2", "--boxes", "10",
                                  "--seconds", "2", "--rate", "50"))
    for phase in ("baseline", "with_slow_clients"):
        figures = result[phase]
        assert figures["answered"] > 0 and figures["statuses"] == {"200": figures["answered"]}, (phase, figures)
        assert figures["timeouts"] == figures["transport_errors"] == 0, (phase, figures)
    assert result["connections_open_on_server"] >= 20  # the slow clients are open on the server, not refused
    assert result["holder"]["opened"] == 20 and result["holder"]["connect_failed"] == 0
    assert result["health_during"] is True


def test_config_answer_cost_measures_each_part_of_the_answer_with_every_answer_200() -> None:
    """bench/config_answer_cost.py: the event-loop answer with and without its log line and fetch record;
    its own check fails the run when an answer is not 200 or one is left to the app."""
    out = run_bench("bench/config_answer_cost.py", "--boxes", "20", "--requests", "300", "--rounds", "2")
    figures = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert sorted(figures) == sorted(("full", "no-log", "no-fetch", "neither", "bare")), out
    assert "main" in figures["full"] and "left to the app even then: 0" in out, out
    answers = out.split("answers: ", 1)[1].split(";", 1)[0]
    assert answers == f"{{200: {5 * 2 * 300}}}", out


def test_metrics_scrape_writes_prunes_and_reads_the_full_fetch_log() -> None:
    """bench/metrics_scrape.py at a small size: the log filled to its retention, the batches written past
    it and pruned back by exactly what they added, every read printed."""
    out = run_bench("bench/metrics_scrape.py", "--rows", "2000", "--boxes", "50", "--batches", "3", "--repeat", "1")
    assert "2000 fetch records over 50 boxes written" in out, out
    assert "write, 3 batches of 512: CPU a record" in out, out
    assert f"prune back to 2000: {3 * 512} records dropped" in out, out
    for read in ("last_config_answered", "last_config_served", "latest_reports", "attention",
                 "recent_fetches(box=), 100", "recent_fetches(box=) of a box not in it"):
        assert f"\n{read}: median " in out, (read, out)


def test_gateway_cold_measures_every_step_cold_and_warm() -> None:
    """bench/gateway_cold.py: each step of the request path timed with the caches evicted and warm; its
    own checks fail the run when a step answers wrong (a request not answered 200, the model not found)."""
    out = run_bench("bench/gateway_cold.py", "--samples", "20")
    rows = [line for line in out.splitlines() if line.endswith(tuple("0123456789")) and "(" in line]
    assert len(rows) == 8, out
    for row in rows:
        cold, warm = (float(x) for x in row.split()[-3:-1])
        assert cold > 0 and warm > 0, row
