"""A real PostgreSQL for tests and benchmarks: FLEETLLM_TEST_PG_URL when set (CI creates a role and a
database for it), else a throwaway cluster started here (initdb in a temp dir, a free loopback port,
run as the `postgres` user when we are root), stopped and removed afterwards.

Each test gets a schema of its own in that database (`schema_url`): cheap, and the store keeps its
tables and its advisory-lock keys per schema.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg

from fleetllm.demo.procs import free_port as free_port  # re-exported for this package's tests

ENV_URL = "FLEETLLM_TEST_PG_URL"


def find_bindir() -> Path | None:
    """Where initdb and pg_ctl are: Debian's /usr/lib/postgresql/<newest>/bin, else PATH."""
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
                    if p.parts[-3].isdigit() else 0)
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found and shutil.which("pg_ctl") else None


class Cluster:
    """initdb + pg_ctl start on 127.0.0.1 with scram-sha-256 passwords; `stop()` removes it all."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        # The postgres user must reach its data directory: /tmp itself, whatever TMPDIR says, when root.
        self.root = Path(tempfile.mkdtemp(prefix="fleetllm-pg-", dir="/tmp" if self._as_postgres else None))
        self.port = free_port()
        self.password = secrets.token_urlsafe(18)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._as_postgres:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-A", "scram-sha-256", "-U", "postgres", f"--pwfile={pwfile}",
                  "--no-sync")
        pwfile.unlink()
        self.start()

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "postgres.log"), "-w", "-t", "60", "-o",
                  f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200", "start")

    def halt(self) -> None:
        """Stop the server, keeping its data (`start()` brings it back on the same port)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120, cwd=self.root)

    @property
    def url(self) -> str:
        return f"postgresql://postgres:{quote(self.password, safe='')}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def database_url() -> Iterator[str | None]:
    """FLEETLLM_TEST_PG_URL, or a throwaway cluster's URL for the block; None without PostgreSQL."""
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    cluster = Cluster(bindir)
    try:
        yield cluster.url
    finally:
        cluster.stop()


def with_schema(url: str, schema: str) -> str:
    """The URL with the schema first on the search_path (libpq's `options`)."""
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def schema_url(url: str) -> Iterator[str]:
    """A fresh schema in the database at `url`, dropped afterwards."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
    try:
        yield with_schema(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE".encode())


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password): a config file takes the password apart."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hostport}")), unquote(parts.password)
