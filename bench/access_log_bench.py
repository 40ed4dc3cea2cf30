"""What the access log costs a page or API request: the WSGI wrapper (fleetllm.server.accesslog) around
a Flask app with one trivial route, called in process, with and without the wrapper, the log lines
going to the server's buffered JSON handler writing to /dev/null.

    .venv/bin/python bench/access_log_bench.py [--requests 20000] [--rounds 5]

Prints the median microseconds per request of each variant over the rounds, their difference (the
access log's cost: route note, one JSON line formatted, queued for the writer thread), and the load
average. In process and single-threaded: no socket, no Tornado; the request's own cost on a real server
is in docs/benchmarks.md's other sections.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask

from fleetllm.logs import setup_logging
from fleetllm.server.accesslog import access_logged

ENVIRON = {"REQUEST_METHOD": "GET", "PATH_INFO": "/health", "QUERY_STRING": "verbose=1", "SERVER_NAME": "x",
           "SERVER_PORT": "80", "wsgi.url_scheme": "http", "REMOTE_ADDR": "127.0.0.1", "wsgi.input": io.BytesIO()}


def app() -> Flask:
    flask = Flask("bench")
    flask.add_url_rule("/health", "health", lambda: {"status": "ok"})
    return flask


def run(wsgi: Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]], requests: int) -> float:
    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        return None

    began = time.perf_counter()
    for _ in range(requests):
        body = wsgi(dict(ENVIRON), start)
        for _chunk in body:
            pass
        close = getattr(body, "close", None)
        if close is not None:
            close()
    return (time.perf_counter() - began) / requests * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with open(os.devnull, "w") as sink:
        setup_logging(sink, buffered=True)
        plain, logged = app(), app()
        wrapped = access_logged(logged)
        run(plain, 500)  # warm up both
        run(wrapped, 500)
        without = [run(plain, args.requests) for _ in range(args.rounds)]
        with_log = [run(wrapped, args.requests) for _ in range(args.rounds)]
    a, b = statistics.median(without), statistics.median(with_log)
    print(f"python {sys.version.split()[0]}, {args.requests} requests x {args.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"without the access log: {a:.1f} us/request")
    print(f"with the access log:    {b:.1f} us/request  (+{b - a:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
