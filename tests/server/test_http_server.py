"""The control plane's HTTP server (server/httpserver.py) in front of a WSGI app of the test's own, over
real sockets: the WSGI environment it builds, the answers it writes (HEAD, 304, the app's hop-by-hop
headers), the Host rule, and what it refuses or cuts (a body over its cap or late, an answer nobody
reads, a connection over the per-peer cap)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from fleetllm.server.httpserver import call_wsgi, host_is_valid, wsgi_environ
from fleetllm_gateway.httpserver import Request
from tests.support.plane_thread import detached_request, on_loop, plane_serving


def make_request(target: str, fields: list[tuple[str, str]], version: str = "1.1", method: str = "GET") -> Request:
    return detached_request(target, fields, method=method, version=version, remote="192.0.2.7")


def test_the_wsgi_environment_holds_the_request_as_pep_3333_says() -> None:
    request = make_request("/a%20b/%C3%A9?x=1&y", [
        ("Host", "example.org:8443"), ("Content-Type", "text/plain"), ("Content-Length", "99"),
        ("X-Twice", "a"), ("x-twice", "b"), ("X_Forwarded_For", "203.0.113.9"), ("X-Forwarded-For", "198.51.100.1"),
        ("X-Text", "caf\u00e9"), ("Transfer-Encoding", "chunked")], method="POST")
    environ = wsgi_environ(request, b"abc", "https", ("127.0.0.1", 9000))
    assert environ["REQUEST_METHOD"] == "POST"
    assert environ["PATH_INFO"] == "/a b/\u00c3\u00a9"  # the bytes of /a b/é, as latin-1 text
    assert environ["QUERY_STRING"] == "x=1&y"
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("example.org", "8443")
    assert (environ["REMOTE_ADDR"], environ["wsgi.url_scheme"], environ["SERVER_PROTOCOL"]) == \
        ("192.0.2.7", "https", "HTTP/1.1")
    assert (environ["CONTENT_TYPE"], environ["CONTENT_LENGTH"]) == ("text/plain", "3")  # the body read, not the claim
    assert environ["wsgi.input"].read() == b"abc"
    assert environ["HTTP_X_TWICE"] == "a,b"
    assert environ["HTTP_X_FORWARDED_FOR"] == "198.51.100.1"  # the underscore spelling is dropped, not merged
    assert environ["HTTP_X_TEXT"] == "caf\u00e9".encode().decode("latin-1")
    assert "HTTP_CONTENT_LENGTH" not in environ and "HTTP_CONTENT_TYPE" not in environ
    assert "HTTP_TRANSFER_ENCODING" not in environ  # read and de-chunked: CONTENT_LENGTH says its length


def test_without_a_port_in_host_the_server_names_its_own() -> None:
    environ = wsgi_environ(make_request("/", [("Host", "[2001:db8::1]")]), b"", "http", ("127.0.0.1", 9000))
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("[2001:db8::1]", "9000")
    environ = wsgi_environ(make_request("/", [("Host", "[2001:db8::1]:81")]), b"", "http", ("127.0.0.1", 9000))
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("[2001:db8::1]", "81")


@pytest.mark.parametrize(("fields", "version", "valid"), [
    ([("Host", "example.org")], "1.1", True),
    ([("Host", "10.0.0.1:8080")], "1.1", True),
    ([("Host", "[::1]:8080")], "1.1", True),
    ([("Host", "")], "1.1", True),  # RFC 9112 allows an empty one
    ([], "1.0", True),
    ([], "1.1", False),
    ([("Host", "a:b")], "1.1", False),
    ([("Host", "a b")], "1.1", False),
    ([("Host", "a/b")], "1.1", False),
    ([("Host", "a"), ("host", "a")], "1.1", False),
])
def test_the_host_rule(fields: list[tuple[str, str]], version: str, valid: bool) -> None:
    assert host_is_valid(make_request("/", fields, version)) is valid


def test_call_wsgi_runs_the_app_to_the_end_and_closes_its_body() -> None:
    closed: list[bool] = []

    class Body:
        def __iter__(self) -> Any:
            yield b"one,"
            yield b"two"

        def close(self) -> None:
            closed.append(True)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("418 I'm a teapot", [("X-A", "1")])
        return Body()

    assert call_wsgi(app, {}) == (418, "I'm a teapot", [("X-A", "1")], b"one,two")
    assert closed == [True]


def echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Answers with what it saw; /304 answers 304; /hop sets its own hop-by-hop headers."""
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read()
    if path == "/304":
        start_response("304 Not Modified", [("ETag", '"x"')])
        return []
    out = json.dumps({"path": path, "body": len(body), "host": environ.get("HTTP_HOST")}).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    if path == "/hop":
        headers += [("Connection", "keep-alive"), ("Transfer-Encoding", "identity"), ("Keep-Alive", "timeout=5")]
    start_response("200 OK", headers)
    return [out]


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`, then read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionResetError):  # a close with our bytes unread is a reset
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def wait_for_connections(server: Any, count: int) -> None:
    """Until the server holds `count` admitted connections (at most 10 s; the assertion says if not)."""
    deadline = time.monotonic() + 10
    while on_loop(server, lambda: server.caps.total) != count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert on_loop(server, lambda: server.caps.total) == count


def head_of(answer: bytes) -> list[str]:
    return answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")


def test_answers_carry_one_length_and_the_server_s_own_connection_headers() -> None:
    with plane_serving(echo) as server:
        port = server.local[1]
        answer = exchange(port, b"GET /hop HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        head = head_of(answer)
        assert head[0] == "HTTP/1.1 200 OK"
        assert sum(line.lower().startswith("content-length:") for line in head) == 1
        assert [line for line in head if line.lower().startswith(("connection", "keep-alive", "transfer-"))] == \
            ["Connection: close"]
        assert "Server: fleetllm" in head and any(line.startswith("Date: ") for line in head)
        length = next(int(line.split(": ")[1]) for line in head if line.startswith("Content-Length"))
        assert len(answer.partition(b"\r\n\r\n")[2]) == length

        answer = exchange(port, b"HEAD /hop HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert answer.endswith(b"\r\n\r\n") and f"Content-Length: {length}" in head_of(answer)  # the app's, no body

        answer = exchange(port, b"GET /304 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        head = head_of(answer)
        assert head[0] == "HTTP/1.1 304 Not Modified" and not any(line.startswith("Content-Length") for line in head)


def test_a_request_breaking_the_host_rule_is_answered_400_and_closed() -> None:
    with plane_serving(echo) as server:
        for request in (b"GET / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                        b"GET / HTTP/1.1\r\nHost: a:b\r\n\r\n"):
            answer = exchange(server.local[1], request)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Host header" in answer
        assert exchange(server.local[1], b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200 OK\r\n")


def test_a_body_over_its_cap_is_refused_before_it_is_read_and_a_late_one_is_cut() -> None:
    with plane_serving(echo, body_timeout_s=0.5, budget=8 << 20) as server:  # 2 MiB a peer
        port = server.local[1]
        answer = exchange(port, b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"larger than this endpoint takes" in answer
        chunked = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + \
            b"".join(b"10000\r\n" + b"x" * 0x10000 + b"\r\n" for _ in range(17)) + b"0\r\n\r\n"
        assert exchange(port, chunked).startswith(b"HTTP/1.1 400 Bad Request\r\n")  # 1.06 MiB, over 1 MiB
        started = time.monotonic()
        answer = exchange(port, b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        assert answer == b"" and time.monotonic() - started < 8  # closed unanswered at the body deadline
        answer = exchange(port, b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b'"body": 3, "host": "t"}')
        answer = exchange(port, b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b'"body": 5, "host": "t"}')


def test_an_answer_nobody_reads_is_dropped_after_the_send_deadline() -> None:
    big = b"x" * (64 << 20)

    def large(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [big]

    with plane_serving(large, send_timeout_s=0.2) as server, \
            socket.create_connection(("127.0.0.1", server.local[1]), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert sock.recv(1) == b"H"  # the answer is being written
        assert on_loop(server, lambda: len(server.connections)) == 1
        deadline = time.monotonic() + 10
        while on_loop(server, lambda: len(server.connections)) and time.monotonic() < deadline:
            on_loop(server, lambda: server.sweep(time.monotonic()))
            time.sleep(0.1)
        assert on_loop(server, lambda: len(server.connections)) == 0


def test_a_connection_over_the_per_peer_cap_is_closed_before_a_byte_is_read() -> None:
    with plane_serving(echo, per_peer=2) as server:
        held = [socket.create_connection(("127.0.0.1", server.local[1]), timeout=10) for _ in range(2)]
        try:
            wait_for_connections(server, 2)
            assert exchange(server.local[1], b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") == b""
            assert on_loop(server, lambda: dict(server._refused)) == {"per_peer": 1}
        finally:
            for sock in held:
                sock.close()
        wait_for_connections(server, 0)
        assert exchange(server.local[1], b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n") \
            .startswith(b"HTTP/1.1 200 OK")


def test_with_tls_a_connection_is_capped_before_its_handshake_and_a_late_handshake_is_cut() -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    def scheme(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["wsgi.url_scheme"].encode()]

    with plane_serving(scheme, per_peer=2, header_timeout_s=2.0, tls=server_context) as server:
        port = server.local[1]
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]  # no handshake
        try:
            wait_for_connections(server, 2)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third, \
                    contextlib.suppress(ConnectionResetError):
                assert third.recv(1) == b""  # closed at once: the peer holds its two
            assert on_loop(server, lambda: dict(server._refused)) == {"per_peer": 1}
            for sock in silent:  # cut at the handshake's deadline
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""
        finally:
            for sock in silent:
                sock.close()
        wait_for_connections(server, 0)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client_context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhttps")
