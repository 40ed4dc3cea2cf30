"""Several worker processes on one port (`--workers N`; gateway/README.md, "Workers"), with the real
gateway processes: every worker serves, a model's limit and queue hold across them, the metrics add up,
SIGHUP reloads without dropping a request, and no process outlives the gateway."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import (
    ROOT,
    TOKEN,
    GatewayProcess,
    Upstreams,
    free_port,
    reference_config,
    running_gateway,
)
from tests.gateway.upstreams import HELD, holding, reset_held
from tests.installer.realprocs import wait_until

ECHO = b'{"model":"echo"}'


def workers_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def accepted(port: int) -> set[int]:
    """Inodes of the established TCP sockets whose local port is `port` (the gateway's side)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(int(fields[9]))
    return inodes


def spread(gateway: GatewayProcess, count: int) -> list[http.client.HTTPConnection]:
    """`count` open keep-alive connections, once the gateway accepted them all on at least two workers."""
    connections = [http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60) for _ in range(count)]
    for conn in connections:
        conn.connect()
    assert gateway.proc is not None
    workers = workers_of(gateway.proc.pid)

    def holders() -> list[int] | None:
        ours = accepted(gateway.port)
        held = [len(ours & socket_inodes(worker)) for worker in workers]
        return held if sum(held) == count else None

    held = wait_until(f"{count} connections accepted", holders)
    assert sum(1 for n in held if n) >= 2, f"connections per worker: {held}"  # 2**-(count-1) by chance
    return connections


def post(conn: http.client.HTTPConnection, path: str = "/held", body: bytes = ECHO) -> int:
    conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {TOKEN}"})
    response = conn.getresponse()
    response.read()
    return response.status


def answered(futures: list[concurrent.futures.Future[int]], count: int) -> list[int]:
    wait_until(f"{count} answered", lambda: sum(f.done() for f in futures) >= count)
    return [f.result() for f in futures if f.done()]


def metric(gateway: GatewayProcess, line_start: str) -> float:
    text = gateway.request("GET", "/metrics").body.decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start + " ")]
    return values[0] if values else 0.0


def test_every_worker_serves_and_the_metrics_add_up(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams), args=("--workers", "3")) as gateway:
        assert gateway.proc is not None
        assert len(workers_of(gateway.proc.pid)) == 3
        connections = spread(gateway, 12)
        assert [post(conn, "/v1/x") for conn in connections] == [200] * 12
        # whichever worker answers, it counts every worker's requests
        for _ in range(4):
            assert metric(gateway, 'fleetllm_gateway_requests_total{model="echo",code="200"}') == 12


@contextmanager
def eight_held(upstreams: Upstreams, **limits: Any) -> Iterator[tuple[GatewayProcess, list[Any]]]:
    """Eight `.../held` requests at once to a gateway of 3 workers, on connections spread over them; the
    block runs while the upstream holds those it got, and the requests' futures are done after it."""
    with running_gateway(reference_config(upstreams, **limits), args=("--workers", "3")) as gateway:
        connections = spread(gateway, 8)
        reset_held()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            with holding():
                requests = [pool.submit(post, conn) for conn in connections]
                yield gateway, requests
            concurrent.futures.wait(requests)


def test_a_limit_of_two_holds_across_workers(upstreams: Upstreams) -> None:
    with eight_held(upstreams, maxConcurrentRequests=2, maxQueuedRequests=0) as (gateway, requests):
        assert answered(requests, 6) == [503] * 6  # refused at once, the two held upstream
        assert HELD["now"] == 2
        assert metric(gateway, 'fleetllm_gateway_requests_in_flight{model="echo"}') == 2
        assert metric(gateway, 'fleetllm_gateway_requests_total{model="echo",code="503"}') == 6
    assert sorted(f.result() for f in requests) == [200, 200] + [503] * 6
    assert HELD["most"] == 2


def test_the_queue_length_holds_across_workers(upstreams: Upstreams) -> None:
    limits = {"maxConcurrentRequests": 1, "maxQueuedRequests": 2, "queueTimeoutSeconds": 60}
    with eight_held(upstreams, **limits) as (gateway, requests):
        assert answered(requests, 5) == [503] * 5  # 1 in flight, 2 queued, wherever they arrived
        assert metric(gateway, 'fleetllm_gateway_requests_queued{model="echo"}') == 2
    # the queued ones got the slot one at a time, whichever worker freed it
    assert sorted(f.result() for f in requests) == [200] * 3 + [503] * 5
    assert HELD["most"] == 1


@contextmanager
def traffic(gateway: GatewayProcess) -> Iterator[list[Any]]:
    """Requests one after another, each on a new connection, until the block ends: their outcomes."""
    outcomes: list[Any] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                outcomes.append(gateway.request("POST", "/v1/x", body=ECHO, timeout=30).status)
            except OSError as exc:
                outcomes.append(repr(exc))

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield outcomes
    finally:
        stop.set()
        thread.join()


def reload(gateway: GatewayProcess, config: dict[str, Any], event: str) -> None:
    assert gateway.proc is not None
    before = gateway.stderr().count(event)
    gateway.config_path.write_text(json.dumps({**config, "port": gateway.port}))
    gateway.proc.send_signal(signal.SIGHUP)
    wait_until(event, lambda: gateway.stderr().count(event) > before)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sighup_reloads_every_worker_without_dropping_a_request(upstreams: Upstreams, workers: str) -> None:
    config = reference_config(upstreams, maxConcurrentRequests=4)
    with running_gateway(config, args=("--workers", workers)) as gateway:
        assert gateway.proc is not None
        old = workers_of(gateway.proc.pid)
        assert gateway.request("POST", "/v1/x", body=b'{"model":"added"}').status == 404
        with concurrent.futures.ThreadPoolExecutor(1) as pool, traffic(gateway) as outcomes:
            with holding():
                held = pool.submit(lambda: gateway.request("POST", "/held", body=ECHO, timeout=60).status)
                gateway.wait_in_flight("echo", 1)
                config["models"]["added"] = {"url": upstreams.base_url}
                reload(gateway, config, '"event":"reloaded"')
                assert gateway.request("POST", "/v1/x", body=b'{"model":"added"}').status == 200
                wait_until("more requests", lambda: len(outcomes) > 20)
                if old:  # the old worker that has the held request is still finishing it
                    assert any(running(pid) for pid in old)
            assert held.result() == 200  # begun before the reload, finished after it
        assert set(outcomes) == {200}, outcomes
        wait_until("the old workers exited", lambda: not any(running(pid) for pid in old))
        assert len(workers_of(gateway.proc.pid)) == int(workers) - (workers == "1")
        # the counters kept adding up through the reload
        assert metric(gateway, 'fleetllm_gateway_requests_total{model="echo",code="200"}') >= len(outcomes) + 1
        assert gateway.stop() == 0


def test_an_invalid_config_on_sighup_keeps_the_running_one(upstreams: Upstreams) -> None:
    config = reference_config(upstreams)
    with running_gateway(config, args=("--workers", "2")) as gateway:
        assert gateway.proc is not None
        before = workers_of(gateway.proc.pid)
        broken = {**config, "models": {"echo": {"url": "ftp://nowhere"}}}
        reload(gateway, broken, "reload refused")
        assert "cannot notify" not in gateway.stderr()
        assert "config: models.echo: url" in gateway.stderr()
        assert gateway.request("POST", "/v1/x", body=ECHO).status == 200
        assert workers_of(gateway.proc.pid) == before


def test_sigterm_leaves_no_process(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams), args=("--workers", "3")) as gateway:
        assert gateway.proc is not None
        pids = workers_of(gateway.proc.pid)
        assert gateway.request("POST", "/v1/x", body=ECHO).status == 200
        assert gateway.stop() == 0
        assert not any(running(pid) for pid in pids)
        assert gateway.stderr().count('"event":"stopping"') == 1  # the master's line, not one per worker


def test_a_worker_that_dies_stops_the_gateway_loudly(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams), args=("--workers", "3")) as gateway:
        assert gateway.proc is not None
        victim, *others = workers_of(gateway.proc.pid)
        os.kill(victim, signal.SIGKILL)
        assert gateway.proc.wait(timeout=30) == 1
        assert f"(pid {victim}) killed by SIGKILL" in gateway.stderr()
        assert "a worker exited: stopping the gateway" in gateway.stderr()
        assert not any(running(pid) for pid in others)


def test_the_workers_die_with_the_master(upstreams: Upstreams) -> None:
    with running_gateway(reference_config(upstreams), args=("--workers", "2")) as gateway:
        assert gateway.proc is not None
        pids = workers_of(gateway.proc.pid)
        gateway.proc.kill()
        gateway.proc.wait()
        wait_until("no worker left", lambda: not any(running(pid) for pid in pids))


def test_a_port_another_gateway_holds_is_refused(upstreams: Upstreams, tmp_path: Path) -> None:
    # SO_REUSEPORT would otherwise let a second gateway of the same user share the port
    with running_gateway(reference_config(upstreams), args=("--workers", "2")) as first:
        path = tmp_path / "second.json"
        path.write_text(json.dumps({**reference_config(upstreams), "port": first.port}))
        result = subprocess.run([sys.executable, "-m", "fleetllm_gateway", "--config", str(path), "--workers", "2"],
                                capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert result.returncode == 1
        assert f"listen tcp 127.0.0.1:{first.port}: " in result.stderr


@pytest.mark.parametrize("value", ["0", "many", "1025"])
def test_workers_flag_is_checked(value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "fleetllm_gateway", "--workers", value], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2
    assert "--workers" in result.stderr and "from 1 to 1024" in result.stderr


def test_without_shared_memory_the_gateway_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import socket

    from fleetllm_gateway import workers
    from fleetllm_gateway.config import parse_config

    class NoShm:
        def Lock(self) -> None:  # noqa: N802 - multiprocessing's spelling
            raise OSError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(workers.multiprocessing, "get_context", lambda method: NoShm())
    port = free_port()
    config = parse_config(json.dumps({"host": "127.0.0.1", "port": port, "models": {"m": {"url": "http://127.0.0.1:9"}}}))
    with pytest.raises(workers.WorkerError, match=r"--workers 1, or give the process a writable /dev/shm"):
        workers.run_workers(config, 2, lambda: config)
    with socket.socket() as probe:  # the sockets it had bound are closed: the port is free
        probe.bind(("127.0.0.1", port))
        probe.listen()


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 2), (8, 8), (9, 8), (96, 8), (0, 1)])
def test_the_default_is_the_usable_cpus_at_most_eight(cpus: int, workers: int) -> None:
    from fleetllm_gateway.workers import default_workers

    assert default_workers(cpus) == workers


def test_the_default_reads_the_cpus_this_process_may_use() -> None:
    from fleetllm_gateway.workers import default_workers

    assert default_workers() == min(len(os.sched_getaffinity(0)), 8)


# Modules no worker needs, each of which cost every worker some 1.2 MiB when it was imported:
# email.utils for the Date header, ctypes.util (with shutil, tempfile and bz2) to find prctl.
UNNEEDED = ("email", "ctypes.util", "shutil", "tempfile", "bz2")
IMPORT_ALL = """
import json, pkgutil, importlib, sys
import fleetllm_gateway
for module in pkgutil.iter_modules(fleetllm_gateway.__path__):
    if module.name != "__main__":
        importlib.import_module("fleetllm_gateway." + module.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_no_module_of_the_gateway_imports_what_a_worker_does_not_need() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=120,
                          check=True)
    modules = json.loads(done.stdout)
    assert "fleetllm_gateway.workers" in modules and "fleetllm_gateway.httpserver" in modules
    assert [m for m in modules if m in UNNEEDED or m.startswith("email.")] == []
