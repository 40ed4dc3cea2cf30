"""The state store on both engines (each test runs on SQLite and on a real PostgreSQL): migrations,
each record kind, caps, the fetch log's retention and its buffer while the database refuses writes."""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from fleetllm.adapters.state import (
    Approval,
    BoxApi,
    BoxReport,
    FetchRecord,
    Sighting,
    StateError,
    open_store,
)
from fleetllm.adapters.state.migrations import MIGRATIONS
from fleetllm.adapters.state.records import MAX_RECORD_CHARS, STORED_CHARS
from fleetllm.adapters.state.sqlite import SqliteDatabase
from fleetllm.adapters.state.sqlstore import _NOTE_LAST_FETCHES, SqlStateStore, _insert_fetches
from fleetllm.adapters.state.store import FetchRetention, sqlite_path
from fleetllm.core.fleet.jsonvalue import freeze_mapping
from fleetllm.core.secret import Secret
from fleetllm_contract.report import ReportOutcome
from tests.state.postgres import free_port, with_schema


def test_url_forms(tmp_path: Path) -> None:
    assert sqlite_path("sqlite:///rel/db.sqlite3", tmp_path) == tmp_path / "rel/db.sqlite3"
    assert sqlite_path("sqlite:////abs/db", tmp_path) == Path("/abs/db")
    assert sqlite_path("sqlite:///:memory:") is None
    with pytest.raises(StateError, match="give sqlite:///PATH") as caught:
        sqlite_path("mysql://user:hunter2@db/x")
    assert "hunter2" not in str(caught.value)


def columns(store: SqlStateStore) -> dict[str, list[str]]:
    """Table -> column names, as the engine reports them."""
    if store.backend == "sqlite":
        tables = [r["name"] for r in store.db.read("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                   "AND name NOT LIKE 'sqlite_%'")]
        return {t: [r["name"] for r in store.db.read(f"PRAGMA table_info({t})")] for t in tables}
    rows = store.db.read("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = "
                         "current_schema() AND table_name != 'fleetllm_schema' ORDER BY ordinal_position")
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["table_name"], []).append(r["column_name"])
    return out


def test_both_engines_get_the_same_schema(tmp_path: Path, pg_url: str) -> None:
    lite, pg = open_store(f"sqlite:///{tmp_path / 'a.db'}"), open_store(pg_url)
    try:
        assert lite.schema_version == pg.schema_version == len(MIGRATIONS)
        assert columns(lite) == columns(pg)
        assert {"fetches", "attention", "box_reports", "approvals", "reconcile_pass"} <= set(columns(pg))
        assert "replica" in columns(pg)["fetches"]
    finally:
        lite.close()
        pg.close()


def test_created_migrated_and_reopened(store_url: str) -> None:
    store = open_store(store_url)
    store.record_approval(Approval(1.0, "h", ("m",), "b", "c" * 40, "d" * 40, "cli"))
    store.close()
    again = open_store(store_url)  # reopening migrates nothing and keeps the data
    try:
        assert again.schema_version == len(MIGRATIONS)
        assert [a.host for a in again.approvals()] == ["h"]
    finally:
        again.close()


def test_sqlite_file_is_wal(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 'sub' / 'state.db'}").close()
    db = sqlite3.connect(tmp_path / "sub" / "state.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_newer_schema_refused(store_url: str) -> None:
    store = open_store(store_url)
    with store.db.transaction() as tx:
        if store.backend == "sqlite":
            tx.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
        else:
            tx.execute("UPDATE fleetllm_schema SET version = ?", (len(MIGRATIONS) + 1,))
    store.close()
    with pytest.raises(StateError, match="newer than this fleetllm"):
        open_store(store_url)


def test_replicas_starting_together_migrate_once(pg_url: str) -> None:
    opened: list[SqlStateStore] = []
    failures: list[BaseException] = []

    def start() -> None:
        try:
            opened.append(open_store(pg_url))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert {s.schema_version for s in opened} == {len(MIGRATIONS)}
    for s in opened:
        s.close()


def test_unwritable_location(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot open"):
        SqliteDatabase(blocker / "state.db")


def test_unreachable_postgres_is_one_clear_error_without_the_password() -> None:
    url = f"postgresql://fleetllm@127.0.0.1:{free_port()}/fleetllm"
    with pytest.raises(StateError) as caught:
        open_store(url, password=Secret("pg-password-never-shown", "test"))
    message = str(caught.value)
    assert "cannot use the PostgreSQL state database postgresql://fleetllm@127.0.0.1:" in message
    assert "Connection refused" in message or "connection failed" in message
    assert "pg-password-never-shown" not in message


def test_a_search_path_without_a_schema_is_named(pg_database: str) -> None:
    with pytest.raises(StateError, match="no schema to create tables in"):
        open_store(with_schema(pg_database, "no_such_schema"))


def test_wrong_password_is_refused_without_echoing_it() -> None:
    # A throwaway cluster of its own, which checks passwords (scram-sha-256): the shared one CI provides
    # trusts every login, so there a wrong password would prove nothing.
    from tests.state.conftest import NO_POSTGRES
    from tests.state.postgres import Cluster, find_bindir, split_password
    from tests.support.integration import missing

    bindir = find_bindir()
    if bindir is None:
        missing(NO_POSTGRES)
    cluster = Cluster(bindir)
    try:
        bare, _ = split_password(cluster.url)
        with pytest.raises(StateError) as caught:
            open_store(with_schema(bare, "no_such_schema"), password=Secret("wrong-password-never-shown", "test"))
    finally:
        cluster.stop()
    assert "password authentication failed" in str(caught.value)
    assert "wrong-password-never-shown" not in str(caught.value)


def fetch(at: float, box: str | None, status: int = 200, endpoint: BoxApi = BoxApi.CONFIG) -> FetchRecord:
    return FetchRecord(at=at, endpoint=endpoint, status=status, peer="192.0.2.1", box=box, revision="r",
                       replica="cp-1")


def test_fetch_log(store: SqlStateStore) -> None:
    for i, (box, status) in enumerate([("a", 200), ("b", 200), ("a", 404), ("a", 200), (None, 403)]):
        store.record_fetch(fetch(1000.0 + i, box, status))
    store.record_fetch(fetch(1009.0, "b", 200, BoxApi.REPORT))
    assert [r.at for r in store.recent_fetches(limit=3)] == [1009.0, 1004.0, 1003.0]
    assert [r.at for r in store.recent_fetches(box="a")] == [1003.0, 1002.0, 1000.0]
    assert store.recent_fetches(limit=1)[0] == fetch(1009.0, "b", 200, BoxApi.REPORT)
    served = store.last_config_served()
    assert {box: r.at for box, r in served.items()} == {"a": 1003.0, "b": 1001.0}
    store.record_fetch(fetch(1010.0, "b", 304))  # a poll that found its config current
    store.record_fetch(fetch(1011.0, "a", 503))
    assert store.last_config_answered() == {"a": 1003.0, "b": 1010.0}
    assert store.last_config_served()["b"].at == 1001.0  # "got its config" stays the 200s


def test_a_batch_of_fetch_records_is_written_whole_and_in_order(store: SqlStateStore) -> None:
    """A batch is written a hundred records to a statement (sqlstore.ROWS_PER_INSERT): one over two full
    statements, every field of every record kept, in arrival order."""
    from fleetllm.adapters.state.sqlstore import ROWS_PER_INSERT

    records = [FetchRecord(at=1000.0 + i, endpoint=BoxApi.REPORT if i % 3 else BoxApi.CONFIG, status=200 + i % 5,
                           peer=f"192.0.2.{i % 250}", claimed_host=None if i % 2 else f"box-{i}",
                           forwarded_for=f"198.51.100.{i % 7}" if i % 4 == 0 else None, box=f"box-{i}",
                           revision=None if i % 5 == 0 else f"r{i}", replica="cp-2")
               for i in range(2 * ROWS_PER_INSERT + 1)]
    for record in records:
        store.record_fetch(record)
    store.flush()
    assert [replace(r, id=None) for r in reversed(store.recent_fetches(limit=1000))] == records


def test_fetch_log_retention_by_count_and_by_age(store: SqlStateStore) -> None:
    for i in range(10):
        store.record_fetch(fetch(1000.0 + i, "a"))
    store.flush()
    assert store.prune(FetchRetention(max_rows=4, max_age_s=1e9), now=1010.0) == 6
    assert [r.at for r in store.recent_fetches()] == [1009.0, 1008.0, 1007.0, 1006.0]
    assert store.prune(FetchRetention(max_rows=4, max_age_s=2.5), now=1010.0) == 2  # older than 1007.5
    assert [r.at for r in store.recent_fetches()] == [1009.0, 1008.0]
    assert store.prune(FetchRetention(max_rows=4, max_age_s=100), now=1010.0) == 0


def test_each_boxs_latest_fetch_is_kept_beside_the_log(store: SqlStateStore) -> None:
    """box_last_fetch (migration 11) follows every batch: a later batch moves a box's latest answered
    and served config forward, a 304 moves only the answered one, other endpoints and statuses neither;
    a batch another replica commits after a newer one never moves them back; pruning drops the box
    whose records are all gone, and the box whose 200s alone are gone keeps its answered time."""
    store.record_fetch(fetch(1000.0, "a"))
    store.record_fetch(fetch(1001.0, "b"))
    store.flush()
    store.record_fetch(fetch(1002.0, "a", 304))
    store.record_fetch(fetch(1003.0, "b", 200, BoxApi.REPORT))
    store.record_fetch(fetch(1004.0, "b", 503))
    store.record_fetch(fetch(1005.0, "c", 304))
    assert store.last_config_answered() == {"a": 1002.0, "b": 1001.0, "c": 1005.0}
    assert {box: r.at for box, r in store.last_config_served().items()} == {"a": 1000.0, "b": 1001.0}
    with store.db.transaction() as tx:  # as if another replica's batch, older, were committed after this one
        newest = tx.scalar("SELECT MAX(id) AS id FROM fetches")
        tx.execute("UPDATE box_last_fetch SET answered_id = ?, served_id = ? WHERE box = 'a'", (newest + 10, newest + 10))
        tx.execute(_NOTE_LAST_FETCHES, (-1,))
        assert tx.rows("SELECT answered_id, served_id FROM box_last_fetch WHERE box = 'a'") == [
            {"answered_id": newest + 10, "served_id": newest + 10}]
        tx.execute("UPDATE box_last_fetch SET answered_id = 3, served_id = 1 WHERE box = 'a'")
    assert store.prune(FetchRetention(max_rows=5, max_age_s=1e9), now=2000.0) == 1  # a's 200 goes
    assert store.last_config_answered() == {"a": 1002.0, "b": 1001.0, "c": 1005.0}
    assert set(store.last_config_served()) == {"b"}
    assert store.prune(FetchRetention(max_rows=2, max_age_s=1e9), now=2000.0) == 3
    assert store.db.read("SELECT box FROM box_last_fetch ORDER BY box") == [{"box": "c"}]
    assert store.prune(FetchRetention(max_rows=2, max_age_s=1.0), now=2000.0) == 2
    assert store.db.read("SELECT box FROM box_last_fetch") == []


def test_replicas_writing_the_same_boxes_at_once_keep_each_boxs_latest(pg_url: str) -> None:
    """Two replicas sharing one PostgreSQL log write batches of the same boxes at the same time, one in the
    boxes' order and one in the reverse: every batch is written, and each box's latest is its newest record
    of either. (The upsert's ORDER BY box is what keeps their row locks in one order; this run does not
    show a deadlock without it, PostgreSQL's grouping giving both the same order here.)"""
    replicas = [open_store(pg_url), open_store(pg_url)]
    boxes = [f"box-{i:02d}" for i in range(40)]
    failures: list[Exception] = []

    def write(store: SqlStateStore, order: list[str], replica: str) -> None:
        try:
            for n in range(15):
                for box in order:
                    store.record_fetch(replace(fetch(1000.0 + n, box, 304 if n % 2 else 200), replica=replica))
                store.flush()
        except Exception as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(replicas[0], boxes, "cp-1")),
               threading.Thread(target=write, args=(replicas[1], boxes[::-1], "cp-2"))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        newest = {r.box: r for r in reversed(replicas[0].recent_fetches(limit=10_000))}
        assert len(newest) == len(boxes)
        assert replicas[1].last_config_answered() == {box: r.at for box, r in newest.items()}
        served = replicas[0].last_config_served()
        assert set(served) == set(boxes) and {r.at for r in served.values()} == {1014.0}
    finally:
        for store in replicas:
            store.close()


def test_migration_11_keeps_each_boxs_latest_fetch(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store written before migration 11 (the fetch log indexed by box, no box_last_fetch) reads the same
    latest fetches after it as before."""
    from fleetllm.adapters.state import postgres, sqlite

    for module in (sqlite, postgres):
        monkeypatch.setattr(module, "MIGRATIONS", MIGRATIONS[:10])
    old = open_store(store_url)
    for i, (box, status, endpoint) in enumerate([("a", 200, BoxApi.CONFIG), ("a", 304, BoxApi.CONFIG),
                                                 ("b", 200, BoxApi.CONFIG), ("b", 200, BoxApi.REPORT),
                                                 ("c", 404, BoxApi.CONFIG), (None, 200, BoxApi.CONFIG)]):
        with old.db.transaction() as tx:
            _insert_fetches(tx, [(1000.0 + i, endpoint.value, status, "192.0.2.1", box, None, box, "r", "cp-1")])
    assert old.schema_version == 10
    old.close()
    monkeypatch.undo()
    store = open_store(store_url)
    try:
        assert store.schema_version == len(MIGRATIONS)
        assert store.last_config_answered() == {"a": 1001.0, "b": 1002.0}
        assert {box: r.at for box, r in store.last_config_served().items()} == {"a": 1000.0, "b": 1002.0}
    finally:
        store.close()


def test_fetch_log_is_pruned_on_write(store_url: str) -> None:
    now = [5000.0]
    retention = FetchRetention(max_rows=3, max_age_s=60, every_s=10)
    store = SqlStateStore(open_store(store_url).db, retention, clock=lambda: now[0])
    try:
        for i in range(5):
            store.record_fetch(fetch(now[0] - 100 + i, "old"))  # older than a minute
        for i in range(5):
            store.record_fetch(fetch(now[0] + i, "new"))
        store.flush()  # not yet due: the clock has not moved since the store opened
        assert len(store.recent_fetches()) == 10
        now[0] += 10
        store.record_fetch(fetch(now[0], "new"))
        store.flush()  # due: both limits applied after the write
        assert [r.at for r in store.recent_fetches()] == [5010.0, 5004.0, 5003.0]
    finally:
        store.close()


def test_fetch_records_wait_while_the_database_refuses_them(store: SqlStateStore) -> None:
    store.record_fetch(fetch(1.0, "a"))
    store.flush()
    with store.db.transaction() as tx:
        tx.execute("ALTER TABLE fetches RENAME TO fetches_away")
    store.record_fetch(fetch(2.0, "a"))
    store.record_fetch(fetch(3.0, "a"))
    with pytest.raises(StateError, match="fetches"):
        store.flush()
    store._flush_quietly()  # what the background writer does: remembers why, keeps the records
    assert store.flush_error is not None
    with store.db.transaction() as tx:
        tx.execute("ALTER TABLE fetches_away RENAME TO fetches")
    assert [r.at for r in store.recent_fetches()] == [3.0, 2.0, 1.0]
    assert store.flush_error is None


def test_attention_list_is_bounded_lru(store: SqlStateStore) -> None:
    assert store.note_unknown(Sighting("x", 1.0, "192.0.2.1", "x"), max_entries=2) == 0
    store.note_unknown(Sighting("y", 2.0, "192.0.2.2"), max_entries=2)
    store.note_unknown(Sighting("x", 3.0, "192.0.2.3", "x", "198.51.100.1"), max_entries=2)
    entries = store.attention()
    assert [(e.box, e.count, e.first_seen, e.last_seen, e.peer) for e in entries] == [
        ("x", 2, 1.0, 3.0, "192.0.2.3"), ("y", 1, 2.0, 2.0, "192.0.2.2")]
    assert entries[0].forwarded_for == "198.51.100.1"
    assert store.note_unknown(Sighting("z", 4.0, "192.0.2.4"), max_entries=2) == 1
    assert [e.box for e in store.attention()] == ["z", "x"]  # y was least recently seen
    store.forget("x")
    assert store.attention_size() == 1


def test_reports_keep_latest_per_box(store: SqlStateStore) -> None:
    for i in range(5):
        body = {"revision": f"r{i}", "servers": [{"name": "s", "digest": f"d{i}"}]}
        store.record_report(BoxReport("a", float(i), "192.0.2.1", f"r{i}", "0.1", ReportOutcome.INSTALLED,
                                      freeze_mapping(body)), keep=3)
    store.record_report(BoxReport("b", 9.0, "192.0.2.2", "rb", "0.1", ReportOutcome.FIT_FAILED), keep=3)
    assert [r.revision for r in store.report_history("a")] == ["r4", "r3", "r2"]
    latest = store.latest_reports()
    assert latest["a"].server_digests() == {"s": "d4"}
    assert latest["b"].outcome is ReportOutcome.FIT_FAILED


def test_approvals(store: SqlStateStore) -> None:
    store.record_approval(Approval(1.0, "h", ("m1", "m2"), "approve/h", "c" * 40, "b" * 40, "admin:abc"))
    assert store.approvals() == [Approval(1.0, "h", ("m1", "m2"), "approve/h", "c" * 40, "b" * 40, "admin:abc")]


def test_timestamps_keep_their_precision(store: SqlStateStore) -> None:
    """PostgreSQL's REAL is 4 bytes: the migrations must give it DOUBLE PRECISION."""
    at = 1_800_000_000.123456
    store.record_fetch(fetch(at, "a"))
    assert store.recent_fetches()[0].at == at


def test_pass_lock_is_one_per_database_schema(pg_url: str, pg_database: str, tmp_path: Path) -> None:
    from fleetllm.adapters.state.locks import LockHeld
    from tests.state.postgres import schema_url

    first, second = open_store(pg_url), open_store(pg_url)
    try:
        with first.pass_lock(tmp_path / "ignored.lock"):  # PostgreSQL never uses a lock file
            with pytest.raises(LockHeld, match="PostgreSQL advisory lock in postgresql://") as caught, \
                    second.pass_lock():
                pass
            assert "fleetllm-reconcile" in str(caught.value)  # the holder's session, by name
            with schema_url(pg_database) as other_fleet:  # another schema is another fleet
                other = open_store(other_fleet)
                with other.pass_lock():
                    pass
                other.close()
        with second.pass_lock():  # released with the pass
            pass
    finally:
        first.close()
        second.close()
    assert not (tmp_path / "ignored.lock").exists()


def test_sqlite_pass_lock_is_a_file_beside_the_database(tmp_path: Path) -> None:
    from fleetllm.adapters.state.locks import LockHeld

    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        with store.pass_lock():
            assert (tmp_path / "state.db.reconcile.lock").read_text().strip() == str(os.getpid())
            with pytest.raises(LockHeld, match=r"state\.db\.reconcile\.lock \(pid \d+\)"), store.pass_lock():
                pass
    finally:
        store.close()


def config_problems(tmp_path: Path, state: str) -> str:
    from fleetllm.errors import ConfigurationError as ConfigError
    from fleetllm.settings import load_config

    path = tmp_path / "cp.yaml"
    path.write_text(f"repo: {{path: /x}}\nsecrets: {{vllm_api_salt: '${{env:SALT}}'}}\nstate: {state}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"SALT": "salt-0123456789abcdef", "PG": "pg-secret"})
    return str(caught.value)


def test_config_keeps_the_password_out_of_the_url(tmp_path: Path) -> None:
    from fleetllm.settings import load_config

    message = config_problems(tmp_path, "{url: 'postgresql://fleetllm:hunter2-in-url@db/fleetllm'}")
    assert "/state/url: the URL carries a password" in message
    assert "hunter2-in-url" not in message
    message = config_problems(tmp_path, "{url: 'sqlite:///s.db', password: '${env:PG}'}")
    assert "/state/password: a password is only for a postgresql:// state url" in message
    message = config_problems(tmp_path, "{url: 'postgresql://fleetllm@db/fleetllm', password: pg-literal}")
    assert "/state/password" in message
    assert "pg-literal" not in message  # a literal is refused without being echoed
    path = tmp_path / "ok.yaml"
    path.write_text("repo: {path: /x}\nsecrets: {vllm_api_salt: '${env:SALT}'}\n"
                    "state: {url: 'postgresql://fleetllm@db/fleetllm', password: '${env:PG}', "
                    "fetch_log_max_rows: 5000, fetch_log_max_age_days: 0.5}\n")
    config = load_config(path, {"SALT": "salt-0123456789abcdef", "PG": "pg-secret"})
    assert config.state.password is not None
    assert config.state.password.reveal() == "pg-secret"
    assert "pg-secret" not in repr(config)
    assert config.state.retention == FetchRetention(5000, 43200.0)


def test_client_text_is_cut_and_marked_before_it_is_stored(store: SqlStateStore) -> None:
    """Issue 16, finding 2: X-Forwarded-For, X-LLMAO-Host and the box name come from the client: each
    is stored cut to its cap with a mark, so one request stores at most MAX_RECORD_CHARS of text."""
    huge_xff = ", ".join(["198.51.100.7" * 700] * 95)  # about 800 kB, as 95 headers of 8 kB joined
    huge_host = "h" * 8192
    store.record_fetch(FetchRecord(at=1.0, endpoint=BoxApi.CONFIG, status=403, peer="192.0.2.1",
                                   claimed_host=huge_host, forwarded_for=huge_xff, box=huge_host))
    stored = store.recent_fetches(limit=1)[0]
    assert stored.forwarded_for == huge_xff[:STORED_CHARS["forwarded_for"]] + f"...[truncated: {len(huge_xff)} chars]"
    assert stored.claimed_host is not None and stored.claimed_host.endswith("[truncated: 8192 chars]")
    assert stored.box is not None and stored.box.startswith("h" * 256)
    text = sum(len(v) for v in (stored.peer, stored.claimed_host, stored.forwarded_for, stored.box) if v)
    assert text <= MAX_RECORD_CHARS
    assert MAX_RECORD_CHARS < 2000
    for i in range(3):  # the attention list too, and its key: one entry per (cut) name
        store.note_unknown(Sighting(huge_host + str(i), 2.0 + i, "192.0.2.1", huge_host, huge_xff), 10)
    entries = store.attention()
    assert len(entries) == 1
    assert entries[0].count == 3
    assert entries[0].forwarded_for is not None and len(entries[0].forwarded_for) <= 512 + 40
    short = FetchRecord(at=3.0, endpoint=BoxApi.CONFIG, status=200, peer="192.0.2.1", box="a")
    store.record_fetch(short)
    assert store.recent_fetches(limit=1)[0] == short  # what fits is stored as it is


def test_one_record_stored_at_several_times_is_stored_as_each_record_would_be(store: SqlStateStore) -> None:
    """The server keeps one record per kind of answer and stores it at each answer's time (`at`): the
    rows are those of a record built and bounded at each, cut once."""
    long = FetchRecord(at=0.0, endpoint=BoxApi.CONFIG, status=200, peer="192.0.2.1", claimed_host="h" * 300,
                       forwarded_for="198.51.100.7, " * 60, box="h" * 300, revision="r" * 40, replica="cp-1")
    for at in (10.0, 11.0):
        store.record_fetch(long, at=at)
        store.record_fetch(replace(long, at=at))  # as each answer recorded itself before
    stored = store.recent_fetches()
    assert stored == [replace(long.bounded(), at=at) for at in (11.0, 11.0, 10.0, 10.0)]
    assert stored[0].forwarded_for == long.forwarded_for[:512] + "...[truncated: 840 chars]"  # type: ignore[index]


def test_fetch_log_pages_by_id(store: SqlStateStore) -> None:
    for i in range(7):
        store.record_fetch(fetch(100.0 + i, "a" if i % 2 else "b"))
    first = store.recent_fetches(limit=3)
    assert [r.at for r in first] == [106.0, 105.0, 104.0]
    assert first[-1].id is not None
    assert [r.at for r in store.recent_fetches(limit=3, before=first[-1].id)] == [103.0, 102.0, 101.0]
    assert [r.at for r in store.recent_fetches(box="a", limit=5, before=first[1].id)] == [103.0, 101.0]


def test_page_sessions_are_held_server_side(store: SqlStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16, finding 11: logout deletes the session row, so every copy of its cookie is refused."""
    store.create_session("d1", "viewer", "fp1", 100.0, 200.0)
    store.create_session("d2", "admin", "fp2", 110.0, 210.0)
    assert store.session_alive("d1", 150.0) == "viewer"
    assert store.session_alive("d2", 150.0) == "admin"
    assert store.session_alive("d1", 200.0) is None  # expired
    assert store.session_alive("nope", 150.0) is None
    assert store.end_session("d2")
    assert not store.end_session("d2")
    assert store.session_alive("d2", 150.0) is None
    monkeypatch.setattr("fleetllm.adapters.state.sqlstore.MAX_SESSIONS", 3)
    for i in range(5):  # expired ones go first, then the oldest beyond the cap
        store.create_session(f"n{i}", "viewer", "fp", 300.0 + i, 900.0)
    assert [store.session_alive(f"n{i}", 400.0) for i in range(5)] == [None, None, "viewer", "viewer", "viewer"]
