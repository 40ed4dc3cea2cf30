"""The state store's schema, one migration list for both engines (tokens: dialect.py).

Append only: migration N (1-based) takes the schema from version N-1 to N. Never edit a released one
(its SQLite rendering must stay what existing databases ran). Each is applied in one transaction with
its version bump, by whichever process opens the store first (several replicas starting together
take turns: postgres.py serialises them with an advisory lock, SQLite with BEGIN IMMEDIATE).
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the control plane's tables.
    """
    CREATE TABLE fetches (
        id {serial},
        at {real} NOT NULL,
        endpoint TEXT NOT NULL,
        status INTEGER NOT NULL,
        peer TEXT NOT NULL,
        claimed_host TEXT,
        forwarded_for TEXT,
        box TEXT,
        revision TEXT
    );
    CREATE INDEX fetches_by_box ON fetches (box, id);
    CREATE TABLE attention (
        box TEXT PRIMARY KEY,
        first_seen {real} NOT NULL,
        last_seen {real} NOT NULL,
        count INTEGER NOT NULL,
        peer TEXT NOT NULL,
        claimed_host TEXT,
        forwarded_for TEXT
    );
    CREATE INDEX attention_by_last_seen ON attention (last_seen);
    CREATE TABLE box_reports (
        id {serial},
        box TEXT NOT NULL,
        received_at {real} NOT NULL,
        peer TEXT NOT NULL,
        revision TEXT NOT NULL,
        installer_version TEXT NOT NULL,
        outcome TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX box_reports_by_box ON box_reports (box, id);
    CREATE TABLE approvals (
        id {serial},
        at {real} NOT NULL,
        host TEXT NOT NULL,
        models TEXT NOT NULL,
        branch TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        base_revision TEXT NOT NULL,
        actor TEXT NOT NULL
    );
    """,
    # 2: the reconciler's own state (sqlstore.py): probe histories, pending deletes, passes.
    """
    CREATE TABLE reconcile_server_history (
        box TEXT NOT NULL,
        port INTEGER NOT NULL,
        history TEXT NOT NULL,
        PRIMARY KEY (box, port)
    );
    CREATE TABLE reconcile_pending_delete (
        id TEXT PRIMARY KEY,
        attempts INTEGER NOT NULL,
        last_error TEXT NOT NULL,
        first_failed_at {real} NOT NULL
    );
    CREATE TABLE reconcile_pass (
        seq {serial_autoincrement},
        started_at {real} NOT NULL,
        revision TEXT NOT NULL,
        mode TEXT NOT NULL,
        ok INTEGER NOT NULL,
        record TEXT NOT NULL
    );
    """,
    # 3: several replicas share one fetch log: which one answered; retention by age reads `at`.
    """
    ALTER TABLE fetches ADD COLUMN replica TEXT;
    CREATE INDEX fetches_by_at ON fetches (at);
    """,
    # 4: status-page sessions held server-side, so that logging out ends them on every replica.
    """
    CREATE TABLE page_sessions (
        digest TEXT PRIMARY KEY,
        role TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        created_at {real} NOT NULL,
        expires_at {real} NOT NULL
    );
    CREATE INDEX page_sessions_by_expiry ON page_sessions (expires_at);
    """,
    # 5: outgoing notifications: what was last sent per open condition (notifications.py), shared by
    # every replica and reconcile run so that a condition is sent once until it clears or is due again.
    """
    CREATE TABLE notification_conditions (
        key TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        summary TEXT NOT NULL,
        first_at {real} NOT NULL,
        sent_at {real} NOT NULL,
        version INTEGER NOT NULL
    );
    CREATE INDEX notification_conditions_by_kind ON notification_conditions (kind);
    """,
    # 6: operator controls without a commit (fleetllm sync|suspend|resume|pin|unpin; control.py): what is in
    # force (one row per control: suspend, pin, sync) and the audit trail of every action.
    """
    CREATE TABLE control_state (
        name TEXT PRIMARY KEY,
        revision TEXT,
        actor TEXT NOT NULL,
        reason TEXT NOT NULL,
        at {real} NOT NULL
    );
    CREATE TABLE control_audit (
        id {serial},
        at {real} NOT NULL,
        action TEXT NOT NULL,
        actor TEXT NOT NULL,
        reason TEXT NOT NULL,
        revision TEXT
    );
    """,
    # 7: staged rollouts (issue 14): one row per target revision, and each agent box's release.
    # `requested` is a person's pause/resume/abort, written by the admin API and taken by the next pass.
    """
    CREATE TABLE rollouts (
        id {serial_autoincrement},
        target TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL,
        started_at {real} NOT NULL,
        updated_at {real} NOT NULL,
        waves INTEGER NOT NULL,
        requested TEXT,
        requested_by TEXT
    );
    CREATE TABLE box_releases (
        box TEXT PRIMARY KEY,
        revision TEXT NOT NULL,
        last_good TEXT NOT NULL,
        released_at {real} NOT NULL,
        state TEXT NOT NULL,
        drain_started_at {real},
        wave INTEGER NOT NULL,
        reason TEXT NOT NULL
    );
    """,
    # 8: boxes that left the placement (issue 25, fleetllm.core.rollout.retire): draining, retiring, retired.
    """
    CREATE TABLE box_retirements (
        box TEXT PRIMARY KEY,
        revision TEXT NOT NULL,
        left_at {real} NOT NULL,
        state TEXT NOT NULL,
        kept_revision TEXT NOT NULL,
        retiring_at {real},
        retired_at {real},
        reason TEXT NOT NULL
    );
    """,
    # 9: the fleet id this store's passes owned LiteLLM's deployments by (fleetllm.core.judge.ownership): one
    # row, so a fleet without fleet.yaml fleet_id stays known as existing when its LiteLLM has been emptied.
    """
    CREATE TABLE fleet_identity (
        name TEXT PRIMARY KEY,
        fleet_id TEXT NOT NULL,
        revision TEXT NOT NULL,
        at {real} NOT NULL
    );
    """,
    # 10: capacity in the reconcile loop (issue 25, fleetllm.job.capacity): the rentals and terminations backing
    # off after a failure (a restart keeps their back-off), and the rentals not yet heard of (slow ones are shown).
    """
    CREATE TABLE capacity_failures (
        key TEXT PRIMARY KEY,
        failures INTEGER NOT NULL,
        last_failed_at {real} NOT NULL,
        error TEXT NOT NULL
    );
    CREATE TABLE capacity_rentals (
        label TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        ident TEXT NOT NULL,
        rented_at {real} NOT NULL
    );
    """,
    # 11: the fetch log without its (box, id) index: each record dirtied a leaf of it, a WAL page a record at
    # the default 200,000 rows. Each box's latest answered and served GET /vllm/config are kept instead, one
    # row a box, written with each batch (sqlstore.SqlStateStore.flush), for /metrics and the pages.
    """
    DROP INDEX fetches_by_box;
    CREATE TABLE box_last_fetch (
        box TEXT PRIMARY KEY,
        answered_id BIGINT NOT NULL,
        served_id BIGINT
    );
    INSERT INTO box_last_fetch (box, answered_id, served_id)
        SELECT box, MAX(id), MAX(CASE WHEN status = 200 THEN id END) FROM fetches
        WHERE endpoint = 'config' AND status IN (200, 304) AND box IS NOT NULL GROUP BY box;
    """,
)
