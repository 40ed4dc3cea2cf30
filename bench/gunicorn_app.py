"""Running the app under gunicorn, in process (gunicorn's documented custom-application API).

No longer how `fleetllm serve` runs (since issue 16 that is reconciler/fleetllm/server/httpserver.py: slow
clients held gunicorn's request threads); kept for bench/config_server_load.py's naive and constant
variants, which compare handlers under one fixed WSGI server. A benchmark's, so it lives in bench/ and
gunicorn is in the `bench` extra only (`pip install -e '.[bench]'`), not a dependency of fleetllm.

One worker process with `threads` request threads (gthread): the served revision, the commit cache
and the refresh loop live in that one process, so a webhook refresh is seen by every request at
once. The runtime is built inside the worker (after the fork), so no thread, SQLite connection or
git subprocess crosses a fork.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from fleetllm.settings import ControlPlaneConfig


class ControlPlaneServer(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type hints
    def __init__(self, config: ControlPlaneConfig, bind: str, load_app: Callable[[], Flask],
                 on_worker_exit: Callable[[], None] | None = None) -> None:
        self.options = {
            "bind": [bind],
            "workers": 1,
            "worker_class": "gthread",
            "threads": config.threads,
            "timeout": config.timeout_s,
            "graceful_timeout": 10,
            "keepalive": 15,
            "accesslog": None,  # every box request is logged by the app as JSON
            "errorlog": "-",
            "loglevel": "warning",
            "proc_name": "fleetllm-serve",
            "preload_app": False,
        }
        if on_worker_exit is not None:  # gunicorn calls it as worker_exit(server, worker)
            self.options["worker_exit"] = lambda _server, _worker: on_worker_exit()
        if config.tls is not None:
            self.options["certfile"] = str(config.tls.cert)
            self.options["keyfile"] = str(config.tls.key)
        self._load_app = load_app
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._load_app()
