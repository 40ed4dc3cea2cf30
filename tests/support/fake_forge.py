"""A fake of GitHub's commit statuses as a real HTTP server process on loopback, held to GitHub's published
OpenAPI description of the two operations (tests/contracts/github-statuses.openapi.json, extracted from
@octokit/openapi by tests/contracts/extract_github_statuses.py):

    POST /repos/{owner}/{repo}/statuses/{sha}           "Create a commit status"  -> 201 Status
    GET  /repos/{owner}/{repo}/commits/{ref}/statuses   "List commit statuses for a reference" -> 200 [Status]

Every request body is validated against the operation's request schema and every answer against its
response schema; a problem is kept in `violations` (and a bad request is answered as GitHub does, 422
Validation Failed), so a test that finds none knows both sides spoke the published shapes. It behaves as
GitHub does where the tests rely on it: the token in `Authorization: Bearer` (or `token`), a 401 "Bad
credentials" without it, a 403 without a User-Agent, a 404 for another repository, a 422 for a
description over 140 characters (not in the description; GitHub's answer, quoted in
tests/contracts/README.md), and, given `--git-dir`, a 422 for a SHA that repository does not have.

Faults for the next status requests are queued over its control API (POST /_fake/faults: a status, a
Retry-After, a Location for a redirect); GET /_fake/state shows every request (headers without the token:
whether it matched) and every violation.

    python -m tests.support.fake_forge --token-file FILE --repository OWNER/NAME --port-file FILE [--git-dir DIR]

`fake_forge(directory)` runs it for a test and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.contracts.openapi import component_schema, load, problems, request_schema, response_schema

DOCUMENT = load("github-statuses.openapi.json")
CREATE = "/repos/{owner}/{repo}/statuses/{sha}"
LIST = "/repos/{owner}/{repo}/commits/{ref}/statuses"
DOCS = "https://docs.github.com/rest/commits/statuses#create-a-commit-status"
JSON_TYPE = "application/json"
MAX_DESCRIPTION = 140
ROOT = Path(__file__).resolve().parents[2]
FAKE_TOKEN = "ghp_fakeForgeToken7Kq2"  # the fake's own token, recognisable in a secret scan


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


@dataclass
class Forge:
    token: str
    repository: str
    git_dir: Path | None = None
    statuses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # sha -> statuses, oldest first
    requests: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 1

    # -- answers, each validated ------------------------------------------------------------------
    def answer(self, operation: tuple[str, str], status: int, body: Any, headers: dict[str, str] | None = None,
               schema: dict[str, Any] | None = None) -> web.Response:
        path, method = operation
        try:
            checked = schema or response_schema(DOCUMENT, path, status, JSON_TYPE, method)
        except AssertionError:  # the operation lists no such answer: GitHub's error bodies are its components
            checked = component_schema(DOCUMENT, "validation-error" if status == 422 else "basic-error")
        self.violations += [f"answer {method.upper()} {path} {status}: {p}" for p in problems(checked, body)]
        return web.json_response(body, status=status, headers=headers)

    def error(self, operation: tuple[str, str], status: int, message: str,
              errors: list[dict[str, Any]] | None = None) -> web.Response:
        body: dict[str, Any] = {"message": message, "documentation_url": DOCS}
        if errors is not None:
            body["errors"] = errors
        if status != 422:
            body["status"] = str(status)
        return self.answer(operation, status, body)

    def creator(self) -> dict[str, Any]:
        return {"login": "fleetllm-bot", "id": 7, "node_id": "MDQ6VXNlcjc=", "avatar_url": "", "gravatar_id": "",
                "url": "https://api.github.com/users/fleetllm-bot", "html_url": "https://github.com/fleetllm-bot",
                **{f"{k}_url": f"https://api.github.com/users/fleetllm-bot/{k}" for k in (
                    "followers", "following", "gists", "starred", "subscriptions", "organizations", "repos",
                    "events", "received_events")},
                "type": "Bot", "site_admin": False}

    # -- the request's checks --------------------------------------------------------------------
    def record(self, request: web.Request, body: Any) -> dict[str, Any]:
        given = request.headers.get("Authorization", "")
        entry = {"method": request.method, "path": request.path, "authorized": given in (
            f"Bearer {self.token}", f"token {self.token}"), "accept": request.headers.get("Accept"),
            "api_version": request.headers.get("X-GitHub-Api-Version"),
            "user_agent": request.headers.get("User-Agent"), "body": body, "at": time.time()}
        self.requests.append(entry)
        return entry

    def refused(self, operation: tuple[str, str], request: web.Request, entry: dict[str, Any]) -> web.Response | None:
        if not entry["user_agent"]:
            return self.error(operation, 403, "Request forbidden by administrative rules. Please make sure your "
                              "request has a User-Agent header")
        if not entry["authorized"]:
            return self.error(operation, 401, "Bad credentials")
        if f"{request.match_info['owner']}/{request.match_info['repo']}" != self.repository:
            return self.error(operation, 404, "Not Found")
        return None

    def known(self, sha: str) -> bool:
        if self.git_dir is None:
            return True
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            return False
        found = subprocess.run(["git", "-C", str(self.git_dir), "cat-file", "-e", f"{sha}^{{commit}}"],
                               capture_output=True, check=False)
        return found.returncode == 0

    # -- the operations --------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        operation = (CREATE, "post")
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        entry = self.record(request, body)
        if self.faults:
            return self.fault(operation, self.faults.pop(0))
        if (refusal := self.refused(operation, request, entry)) is not None:
            return refusal
        if body is None:
            return self.error(operation, 400, "Problems parsing JSON")
        wrong = problems(request_schema(DOCUMENT, CREATE, "post", JSON_TYPE), body)
        if wrong:
            self.violations += [f"request POST {CREATE}: {p}" for p in wrong]
            return self.error(operation, 422, "Invalid request.\n\n" + "\n".join(wrong))
        description = body.get("description")
        if isinstance(description, str) and len(description) > MAX_DESCRIPTION:
            return self.error(operation, 422, "Validation Failed", [
                {"resource": "Status", "code": "custom", "field": "description",
                 "message": f"description is too long (maximum is {MAX_DESCRIPTION} characters)"}])
        sha = request.match_info["sha"]
        if not self.known(sha):
            return self.error(operation, 422, f"No commit found for SHA: {sha}")
        now = _iso(time.time())
        url = f"{request.scheme}://{request.host}/repos/{self.repository}/statuses/{sha}"
        status = {"url": url, "avatar_url": None, "id": self.next_id,
                  "node_id": base64.b64encode(f"06:Status{self.next_id}".encode()).decode(), "state": body["state"],
                  "description": description, "target_url": body.get("target_url"),
                  "context": body.get("context", "default"), "created_at": now, "updated_at": now,
                  "creator": self.creator()}
        self.next_id += 1
        self.statuses.setdefault(sha, []).append(status)
        return self.answer(operation, 201, status, {"Location": url})

    async def list(self, request: web.Request) -> web.StreamResponse:
        operation = (LIST, "get")
        entry = self.record(request, None)
        if (refusal := self.refused(operation, request, entry)) is not None:
            return refusal
        newest_first = list(reversed(self.statuses.get(request.match_info["ref"], [])))
        return self.answer(operation, 200, newest_first)

    def fault(self, operation: tuple[str, str], fault: dict[str, Any]) -> web.Response:
        status = int(fault["status"])
        headers = {}
        if fault.get("retry_after") is not None:
            headers["Retry-After"] = str(fault["retry_after"])
        if fault.get("location"):
            headers["Location"] = str(fault["location"])
        if 300 <= status < 400:
            return web.Response(status=status, headers=headers)
        message = fault.get("message") or {401: "Bad credentials", 403: "You have exceeded a secondary rate limit",
                                           404: "Not Found"}.get(status, "Server Error")
        body: dict[str, Any] = {"message": message, "documentation_url": DOCS}
        if status != 422:
            body["status"] = str(status)
        response = self.answer(operation, status, body)
        response.headers.update(headers)
        return response

    # -- the control API --------------------------------------------------------------------------
    async def add_faults(self, request: web.Request) -> web.Response:
        self.faults += list(await request.json())
        return web.json_response({"queued": len(self.faults)})

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "violations": self.violations, "faults": self.faults})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/repos/{owner}/{repo}/statuses/{sha}", self.create)
        app.router.add_get("/repos/{owner}/{repo}/commits/{ref}/statuses", self.list)
        app.router.add_post("/_fake/faults", self.add_faults)
        app.router.add_get("/_fake/state", self.state)
        return app


async def serve(forge: Forge, port_file: Path) -> None:
    runner = web.AppRunner(forge.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    temporary = port_file.with_suffix(".tmp")
    temporary.write_text(str(port))
    temporary.replace(port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a fake of GitHub's commit statuses on loopback")
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--repository", required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--git-dir", type=Path)
    args = parser.parse_args(argv)
    forge = Forge(args.token_file.read_text().strip(), args.repository, args.git_dir)
    asyncio.run(serve(forge, args.port_file))
    return 0


# -- for the tests ----------------------------------------------------------------------------------
@dataclass
class ForgeProcess:
    """The running fake: its base URL (forge.api_url), the token it takes, the repository it has."""

    url: str
    token: str
    token_file: Path
    repository: str

    def _call(self, method: str, path: str, data: Any = None, token: str | None = None) -> tuple[int, Any]:
        headers = {"User-Agent": "fleetllm-tests", "Accept": "application/vnd.github+json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=json.dumps(data).encode() if data is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read() or b"null")

    def statuses(self, sha: str) -> list[dict[str, Any]]:
        """GitHub's "List commit statuses for a reference" (newest first), validated like every answer."""
        status, body = self._call("GET", f"/repos/{self.repository}/commits/{sha}/statuses", token=self.token)
        assert status == 200, body
        return list(body)

    def states(self, sha: str) -> list[tuple[str, str]]:
        """(state, description) of the statuses set on `sha`, oldest first."""
        return [(s["state"], s["description"]) for s in reversed(self.statuses(sha))]

    def state(self) -> dict[str, Any]:
        status, body = self._call("GET", "/_fake/state")
        assert status == 200
        return dict(body)

    def violations(self) -> list[str]:
        return list(self.state()["violations"])

    def fault(self, status: int, count: int = 1, *, retry_after: str | None = None, location: str | None = None,
              message: str | None = None) -> None:
        """The next `count` status requests are answered with this (a redirect with `location`)."""
        fault = {"status": status, "retry_after": retry_after, "location": location, "message": message}
        answer, _ = self._call("POST", "/_fake/faults", [fault] * count)
        assert answer == 200


@contextlib.contextmanager
def fake_forge(directory: Path, *, repository: str = "fleet-org/fleet", token: str = FAKE_TOKEN,
               git_dir: Path | None = None) -> Iterator[ForgeProcess]:
    """The fake as its own process for the length of the context (its log in DIRECTORY/fake-forge.log)."""
    directory.mkdir(parents=True, exist_ok=True)
    token_file = directory / "forge-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    port_file = directory / "fake-forge.port"
    port_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tests.support.fake_forge", "--token-file", str(token_file), "--repository",
            repository, "--port-file", str(port_file), *(["--git-dir", str(git_dir)] if git_dir else [])]
    with (directory / "fake-forge.log").open("ab") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the fake forge did not start:\n"
                                     + (directory / "fake-forge.log").read_text(errors="replace"))
            time.sleep(0.05)
        yield ForgeProcess(f"http://127.0.0.1:{int(port_file.read_text())}", token, token_file, repository)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
