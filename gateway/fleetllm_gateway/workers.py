"""Several worker processes on one port (`--workers N`, N >= 2; docs: gateway/README.md, "Workers").

The master binds the listening sockets, one per worker slot and address, with SO_REUSEPORT (the kernel
spreads new connections over the slots), makes what the workers share (fleetllm_gateway.shared: each
limited model's semaphore, the metric tables), then forks a generation of workers, each serving its
slot's sockets on an event loop of its own. It runs no event loop itself: it waits for signals.

- READY=1 once every worker of the generation accepts connections (each tells the master over a pipe).
- SIGHUP: the new configuration is read and checked; an invalid one is logged and the running
  generation keeps serving. A valid one gets a new generation on the same sockets (never closed, so a
  connection waiting in a backlog is taken by the new worker of its slot); once every new worker
  accepts, the old ones get SIGTERM: they stop accepting and finish their requests (SHUTDOWN_GRACE).
  A model whose limits did not change keeps its semaphores, so they hold through the reload.
- SIGTERM or SIGINT: every worker gets SIGTERM and finishes its requests; the master exits once all
  have exited (SIGKILL past the grace), 0.
- A worker that dies on its own (a crash, the OOM killer) stops the gateway loudly: an error line, the
  other workers stopped, exit 1; Supervisor (autorestart) or systemd (Restart=) starts it afresh, with
  fresh slots (a dead worker's slots cannot be told apart from live ones). Workers die with the master
  (PR_SET_PDEATHSIG), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetllm_contract.sdnotify import sd_notify
from fleetllm_gateway.busypoll import DEFAULT_LIMIT_US
from fleetllm_gateway.config import GatewayConfig
from fleetllm_gateway.errors import GatewayError
from fleetllm_gateway.limiter import SharedSlots
from fleetllm_gateway.metrics import Table
from fleetllm_gateway.serve import SHUTDOWN_GRACE, BindError, log_listening, notify, reloaded, serve, serve_forever
from fleetllm_gateway.shared import BodyBytes, Shared

log = logging.getLogger("gateway")

READY_TIMEOUT = 60.0  # seconds a new generation gets until every worker accepts
KILL_AFTER = SHUTDOWN_GRACE + 3.0  # seconds after SIGTERM a worker is killed
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
_PR_SET_PDEATHSIG = 1


# The default's ceiling: a box's gateway fronts one to three vLLM servers, whose GPUs, not the proxy, bound
# what it serves; 8 workers carry several times the 2-worker figures of docs/benchmarks.md, and each costs
# about 10 MiB of its own (PSS; about 15 with aiohttp's server, which the gateway no longer imports).
# `--workers N` sets more.
DEFAULT_MAX_WORKERS = 8


def default_workers(cpus: int | None = None) -> int:
    """The CPUs this process may run on, at most DEFAULT_MAX_WORKERS."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_MAX_WORKERS))


class WorkerError(GatewayError):
    """A worker exited on its own, a generation did not come up, or what the workers share cannot be made."""


@dataclass
class _Generation:
    config: GatewayConfig
    slots: dict[str, tuple[tuple[int, int], SharedSlots]]  # model -> ((limit, queue length), semaphores)
    table: Table
    pids: dict[int, int] = field(default_factory=dict)  # pid -> slot


def bind(config: GatewayConfig, count: int) -> list[list[socket.socket]]:
    """`count` sets of listening sockets on the configured host and port, one per address it names."""
    port = config.port
    try:
        infos = socket.getaddrinfo(config.host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise BindError(f"listen tcp {config.listen_address}: {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in infos))
    for family, address in addresses:  # SO_REUSEPORT would share a port another gateway of this user holds
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((address[0], port, *address[2:]))
            except OSError as exc:
                raise BindError(f"listen tcp {config.listen_address}: {exc.strerror or exc}") from None
    sets: list[list[socket.socket]] = []
    try:
        for _slot in range(count):
            sockets: list[socket.socket] = []
            sets.append(sockets)
            for family, address in addresses:
                sock = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address[0], port, *address[2:]))
                if port == 0:  # the first socket picked the port: the others share it
                    port = sock.getsockname()[1]
                sock.listen(1024)
                sock.setblocking(False)
    except OSError as exc:
        for sock in (s for sockets in sets for s in sockets):
            sock.close()
        raise BindError(f"listen tcp {config.listen_address}: {exc.strerror or exc}") from None
    return sets


class Master:
    def __init__(self, config: GatewayConfig, workers: int, reload: Callable[[], GatewayConfig],
                 busy_poll_us: int = DEFAULT_LIMIT_US) -> None:
        self.workers = workers
        self.busy_poll_us = busy_poll_us
        self.reload = reload
        self.context = multiprocessing.get_context("fork")
        self.pid = os.getpid()
        self.listeners = bind(config, workers)
        self.tables: list[Table] = []
        try:
            self.body_bytes = BodyBytes(self.context)
            self.current = self._generation(config, {})
        except OSError as exc:  # sem_open needs /dev/shm; mmap needs memory
            for sock in (s for sockets in self.listeners for s in sockets):
                sock.close()
            raise WorkerError(f"cannot make what the workers share ({exc.strerror or exc}): run with "
                              "--workers 1, or give the process a writable /dev/shm") from None
        self.retiring: dict[int, float] = {}  # pid -> when it was sent SIGTERM
        self._child_mask: set[int | signal.Signals] = set()
        self._exited: dict[int, int] = {}  # pid -> wait status, of workers reaped but not yet accounted
        self._lost: list[str] = []  # serving workers that exited: the gateway stops

    def _generation(self, config: GatewayConfig, kept: dict[str, tuple[tuple[int, int], SharedSlots]]) -> _Generation:
        slots = {}
        for model in config.models:
            if not model.max_concurrent:
                continue
            limits = (model.max_concurrent, model.max_queued)
            old = kept.get(model.name)
            slots[model.name] = old if old is not None and old[0] == limits else (limits, SharedSlots(
                self.context.Semaphore(model.max_concurrent), self.context.Semaphore(model.max_queued)))
        table = Table(sorted(m.name for m in config.models), self.workers)
        self.tables.append(table)
        return _Generation(config, slots, table)

    def run(self) -> int:
        previous_mask = self._child_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            try:
                self._start(self.current)
            except WorkerError as exc:
                log.error("cannot serve", extra={"fields": {"error": str(exc)}})
                self._stop_all()
                return 1
            log_listening(self.current.config, self.workers)
            notify("READY=1")
            return self._loop()
        finally:
            for sock in (s for sockets in self.listeners for s in sockets):
                sock.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)

    def _loop(self) -> int:
        while True:
            if self._lost:
                log.error("a worker exited: stopping the gateway", extra={"fields": {"worker": "; ".join(self._lost)}})
                self._stop_all()
                return 1
            received = signal.sigtimedwait(_SIGNALS, 1.0)
            self._kill_overdue()
            if received is None:
                continue
            if received.si_signo == signal.SIGCHLD:
                self._lost += self._reap(self.current)
            elif received.si_signo == signal.SIGHUP:
                self._reload()
            else:
                log.info("stopping")
                with contextlib.suppress(OSError):
                    sd_notify("STOPPING=1")
                self._stop_all()
                return 0

    def _reload(self) -> None:
        notify("RELOADING=1", quiet=True)
        try:
            config = reloaded(self.current.config, self.reload)
            if config is None:
                return
            generation = self._generation(config, self.current.slots)
            try:
                self._start(generation)
            except WorkerError as exc:
                log.error("reload failed, still serving the previous configuration",
                          extra={"fields": {"error": str(exc)}})
                self._terminate(list(generation.pids))
                return
            old, self.current = self.current, generation
            self._terminate(list(old.pids))
            log_listening(config, self.workers, event="reloaded")
        finally:
            notify("READY=1", quiet=True)

    def _start(self, generation: _Generation) -> None:
        """Fork the generation's workers; return once every one accepts connections."""
        read_end, write_end = os.pipe()
        try:
            shared_slots = {name: slots for name, (_, slots) in generation.slots.items()}
            for slot in range(self.workers):
                shared = Shared(worker=slot, tables=tuple(self.tables), slots=shared_slots, body_bytes=self.body_bytes)
                pid = os.fork()
                if pid == 0:
                    os.close(read_end)
                    self._child(generation.config, self.listeners[slot], shared, write_end)
                generation.pids[pid] = slot
            os.close(write_end)
            write_end = -1
            self._await_ready(generation, read_end)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)

    def _child(self, config: GatewayConfig, listeners: list[socket.socket], shared: Shared, ready_fd: int) -> None:
        code = 1
        try:
            _die_with_parent()
            if os.getppid() != self.pid:  # the master died before the line above
                return
            signal.pthread_sigmask(signal.SIG_SETMASK, self._child_mask)
            for sockets in self.listeners:  # keep only this slot's (the master keeps them all)
                if sockets is not listeners:
                    for sock in sockets:
                        sock.close()
            os.environ.pop("NOTIFY_SOCKET", None)  # the master speaks for the workers

            def ready() -> None:
                os.write(ready_fd, b"R")
                os.close(ready_fd)

            code = serve_forever(serve(config, listeners=listeners, shared=shared, ready=ready,
                                             busy_poll_us=self.busy_poll_us))
        except BaseException as exc:  # a worker never returns into the master's code
            log.error("worker failed", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
        finally:
            logging.shutdown()
            os._exit(code)

    def _await_ready(self, generation: _Generation, read_end: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        ready = 0
        os.set_blocking(read_end, False)
        while ready < self.workers:
            with contextlib.suppress(BlockingIOError):
                data = os.read(read_end, self.workers)
                ready += len(data)
                if not data:  # every write end closed, some worker without its byte
                    raise WorkerError(f"{self.workers - ready} of {self.workers} workers exited before listening")
                continue
            if time.monotonic() > deadline:
                raise WorkerError(f"{self.workers - ready} of {self.workers} workers not listening after "
                                  f"{READY_TIMEOUT:.0f} s")
            received = signal.sigtimedwait({signal.SIGCHLD}, 0.01)
            if received is not None:
                if dead := self._reap(generation):
                    raise WorkerError(f"a worker exited before listening ({'; '.join(dead)})")
                if generation is not self.current:  # a worker of the serving generation died meanwhile
                    self._lost += self._reap(self.current)

    def _reap(self, generation: _Generation) -> list[str]:
        """Reap exited workers: those of `generation` that exited, described, first; a worker of another
        generation still serving is kept in self._exited for the next call that asks about it."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if self.retiring.pop(pid, None) is None:
                self._exited[pid] = status
        dead = []
        for pid in [pid for pid in self._exited if pid in generation.pids]:
            slot, status = generation.pids.pop(pid), self._exited.pop(pid)
            dead.append(f"worker {slot} (pid {pid}) {_exit_text(status)}")
        return dead

    def _terminate(self, pids: list[int]) -> None:
        now = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            self.retiring[pid] = now

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for pid, since in list(self.retiring.items()):
            if now - since > KILL_AFTER:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _stop_all(self) -> None:
        """SIGTERM every worker, wait for them all (SIGKILL past the grace)."""
        pids = list(self.current.pids)
        self.current.pids.clear()
        self._terminate(pids)
        while self.retiring:
            self._kill_overdue()
            signal.sigtimedwait({signal.SIGCHLD}, 0.2)
            try:
                while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
                    self.retiring.pop(pid, None)
            except ChildProcessError:
                break


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"


def _die_with_parent() -> None:
    """Linux: this process gets SIGTERM when the master dies, so no worker outlives it. prctl is looked up
    among the symbols the process has loaded (libc's): ctypes.util.find_library would cost each process
    1.2 MiB of imports (shutil, tempfile, bz2, ...) and may run ldconfig."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_workers(config: GatewayConfig, workers: int, reload: Callable[[], GatewayConfig],
                busy_poll_us: int = DEFAULT_LIMIT_US) -> int:
    """Serve with `workers` worker processes (>= 2) until SIGTERM or SIGINT; the exit status."""
    return Master(config, workers, reload, busy_poll_us).run()
