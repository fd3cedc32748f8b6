"""The schema, its version table, and :func:`migrate`.

Every store opens the schema on first connect: a version check (one query), and only when
it is behind, the migration, in one transaction under a transaction-scoped advisory lock
keyed by the schema name, so several processes booting together serialise and the later
ones find the work done. The DDL is transactional, so a boot that fails (a lock wait past
``migration_lock_timeout``) leaves nothing half-done and is safe to retry.

Tables (all prefixed ``loom_``): ``executions`` (one row per log: the head, i.e. the next
sequence, which survives prefix truncation), ``events`` (primary key (execution_id,
sequence)), ``fences`` (a row exists once someone acquires), ``timers``, ``leases``,
``schema_version`` and ``maintenance`` (one-time data tasks; the park-fence backfill of
schemas 1 and 2 recorded itself there). Execution ids use the "C" collation, so
``list_executions`` is code-point order.

How concurrent writers of one execution are ordered is written out above ``_BATCH``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql

from loom_core.spi import ANSWERING_KINDS, KERNEL_KINDS
from loom_postgres.database import Connection
from loom_postgres.errors import SchemaMigrationError, SchemaTooNewError
from loom_postgres.failures import describe

__all__ = [
    "SCHEMA_VERSION",
    "MigrationReport",
    "migrate_connection",
    "refuse_unusable",
    "schema_state",
]

SCHEMA_VERSION: Final = 5

# Key space of our advisory locks: the first int of the two-int form is fixed, so an
# application's own advisory locks (usually the one-bigint form) cannot collide.
ADVISORY_CLASS: Final = 0x4C4F4F4D  # "LOOM"

ANSWERING: Final = sorted(ANSWERING_KINDS)
KERNEL: Final = sorted(KERNEL_KINDS)


def _array_literal(kinds: list[str]) -> str:
    # Kernel kind names are plain upper-case identifiers, so their text[] literal needs no
    # quoting; checked here so a future kind with another shape cannot slip through.
    for kind in kinds:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", kind):
            raise ValueError(f"kernel kind {kind!r} needs quoting in an array literal")
    return "{" + ",".join(kinds) + "}"


# The two lists as text[] literals: sent as one text parameter each (never as SQL text),
# which spares psycopg adapting 23 list elements on every write.
ANSWERING_LITERAL: Final = _array_literal(ANSWERING)
KERNEL_LITERAL: Final = _array_literal(KERNEL)

_BOOKKEEPING: Final = (
    """
    CREATE TABLE IF NOT EXISTS loom_schema_version (
        version integer PRIMARY KEY,
        description text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS loom_maintenance (
        task text PRIMARY KEY,
        done_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
)

# The timers table may predate this schema (an older Loom created it without ``redrive``).
# ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` would take ACCESS EXCLUSIVE *before* it
# checks, queueing every boot behind any open transaction on timers; so the catalog is
# consulted first and the table is only locked when the column really is missing.
_TIMERS: Final = """
DO $loom$
DECLARE
    tbl regclass := to_regclass(format('%I.loom_timers', current_schema()));
BEGIN
    IF tbl IS NULL THEN
        CREATE TABLE loom_timers (
            execution_id text COLLATE "C" NOT NULL,
            wake_at timestamptz NOT NULL,
            redrive jsonb,
            PRIMARY KEY (execution_id, wake_at)
        );
    ELSIF NOT EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema()
          AND table_name = 'loom_timers'
          AND column_name = 'redrive'
    ) THEN
        ALTER TABLE loom_timers ADD COLUMN redrive jsonb;
    END IF;
    IF to_regclass(format('%I.loom_timers_due', current_schema())) IS NULL THEN
        CREATE INDEX loom_timers_due ON loom_timers (wake_at, execution_id);
    END IF;
END
$loom$
"""

# acquire_fence_if (see docs/design.md, "The conditional acquire") for direct SQL use:
# one 'c' write of loom_batch, where the logic lives (below), so the store's path and
# this function cannot drift apart. o_status is loom_batch's (0 acquired, 3 stale, 4 no
# log, 5 park_seq at or past the head).
_ACQUIRE_FENCE_IF: Final = """
CREATE OR REPLACE FUNCTION loom_acquire_fence_if(
    p_id text, p_fence bigint, p_park_seq bigint, p_answering text[], p_kernel text[]
) RETURNS TABLE (o_acquired boolean, o_token bigint, o_status smallint)
LANGUAGE plpgsql VOLATILE AS $loom$
BEGIN
    RETURN QUERY
    SELECT b.o_status = 0, b.o_token, b.o_status
    FROM loom_batch(ARRAY['c']::"char"[], ARRAY[p_id], ARRAY[p_park_seq], ARRAY[p_fence],
                    ARRAY[0], '{}'::text[], '{}'::text[], '{}'::text[], ARRAY[NULL]::text[],
                    0, p_answering, p_kernel, 0) b;
END
$loom$
"""

# How the writers of one execution are ordered (the fencing protocol).
#
# Every append updates the execution's head row in loom_executions (or inserts it, for
# the first append) and holds that row lock until it commits. The rest of the protocol
# rides on that lock:
#
# * A token moves only while its execution's head row is locked: acquire_fence locks it
#   (when there is a log) before it bumps, and acquire_fence_if locks it before it reads
#   anything.
# * A fenced append (append with a fence, append_if_unchanged) reads the token in a new
#   statement after its head-row lock was granted. Under READ COMMITTED that statement
#   has a new snapshot, so it sees every token change that committed while the append
#   waited; and a token change that comes later waits for the append's commit. An append
#   that read the token before locking the head row could see a token an acquirer was
#   about to move, and land after it.
# * acquire_fence_if scans for answering events in a new statement after its head-row
#   lock was granted: every append that committed while it waited is in that snapshot,
#   and every later append waits for the acquire's commit, then reads the moved token
#   and is refused. So "the answer lands and the acquire is stale" or "the acquire wins
#   and the answer is refused", never both, for every park, whether or not its execution
#   has a fence row (the fence row is never locked by an append).
# * A refused fenced append undoes its head change before it returns, so a refused write
#   changes nothing.
#
# Lock order, which keeps writers deadlock-free: within one execution, the head row
# before the fence row (appends never lock the fence row; acquires, conditional acquires
# and loom_delete_execution take the head row first); across executions, ascending id
# (the store sorts a batch's writes by id; append_many locks its head rows in id order).
# A transaction waiting at one id therefore holds no lock of a greater id, and within an
# id nobody holds the fence row while waiting for the head row. The one way around it
# needs two transactions creating the same execution at once (an acquire_fence on an id
# whose log is not yet committed writes the fence row with no head row to lock): one of
# the two creations fails anyway, PostgreSQL detects the deadlock, and the store re-runs
# each write alone.
#
# All of it needs a new snapshot per statement, which only READ COMMITTED gives:
# loom_batch and loom_fence_tokens refuse any other isolation level.

# The group-commit entry point: several writes (appends, conditional appends, acquires)
# in one statement, hence one round-trip and one commit. Each write either applies whole
# or reports why not (a status) without changing anything, so one caller's conflict
# never undoes another's append; only an unexpected error aborts the batch, and the
# client then re-runs each write alone. Callers sort the writes by execution id (the lock
# order above).
#
# Statuses: 0 done, 1 sequence conflict, 2 already exists, 3 stale fence, 4 no log
# ('c'), 5 park_seq at or past the head ('c'), 6 an append's fence above the current
# token (never issued). append_if_unchanged and acquire_fence_if report any other token
# than the expected one as stale (3): a park copied by copy_prefix carries its source's
# token while the copy's is 0, and a resumer retries with the token it is given back.
# Ops: 'a' append (fenced when p_fence is not null), 'u' append_if_unchanged (p_fence is
#      the observed token), 'f' acquire_fence, 'c' acquire_fence_if (p_seq is park_seq,
#      p_fence the expected token).
_BATCH: Final = """
CREATE OR REPLACE FUNCTION loom_batch(
    p_op "char"[], p_id text[], p_seq bigint[], p_fence bigint[], p_count integer[],
    p_kind text[], p_payload text[], p_metadata text[], p_channel text[], p_writer bigint,
    p_answering text[], p_kernel text[], p_notify_limit double precision
) RETURNS TABLE (
    o_status smallint, o_head bigint, o_token bigint, o_at timestamptz,
    o_notified boolean
)
LANGUAGE plpgsql VOLATILE AS $loom$
DECLARE
    i integer;
    n integer;
    ev integer := 1;
    cur bigint;
    hd bigint;
    answered boolean;
    room boolean;
    k integer;
    -- The events of the appends that passed their guards, written by one INSERT (see
    -- loom_write_events): an element per event, not per write.
    w_event integer[] := '{}';
    w_id text[] := '{}';
    w_seq bigint[] := '{}';
    w_at timestamptz[] := '{}';
BEGIN
    -- The guards read in statements of their own after a row lock was granted and rely
    -- on seeing what committed during the wait: a new snapshot per statement, which
    -- REPEATABLE READ and SERIALIZABLE do not take.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LM001',
            MESSAGE = format(
                'loom_batch (appends, acquire_fence, acquire_fence_if) runs only under '
                'READ COMMITTED, not %s', current_setting('transaction_isolation')),
            HINT = 'its guards need a fresh snapshot per statement; call it in a READ '
                   'COMMITTED transaction (or autocommit)';
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_op), 0) LOOP
        n := p_count[i];
        o_head := NULL; o_token := NULL; o_at := NULL; o_notified := false;
        IF p_op[i] = 'f' THEN
            -- The head row first (when there is a log): a token moves only under it.
            PERFORM 1 FROM loom_executions e WHERE e.execution_id = p_id[i] FOR UPDATE;
            INSERT INTO loom_fences AS f (execution_id, token) VALUES (p_id[i], 1)
            ON CONFLICT (execution_id) DO UPDATE SET token = f.token + 1
            RETURNING f.token INTO o_token;
            o_status := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF p_op[i] = 'c' THEN
            -- The scan below must see the events this batch gathered for this execution
            -- so far (other executions' events can wait for the end).
            IF p_id[i] = ANY (w_id) THEN
                PERFORM loom_write_events(w_event, w_id, w_seq, w_at, p_kind, p_payload,
                                          p_metadata, p_writer);
                w_event := '{}'; w_id := '{}'; w_seq := '{}'; w_at := '{}';
            END IF;
            -- Waits for in-flight appends and token changes, blocks new ones.
            SELECT e.head INTO hd
            FROM loom_executions e WHERE e.execution_id = p_id[i] FOR UPDATE;
            IF NOT FOUND THEN
                o_status := 4;
                o_head := 0;
                RETURN NEXT;
                CONTINUE;
            END IF;
            o_head := hd;
            IF p_seq[i] >= hd THEN
                o_status := 5;
                RETURN NEXT;
                CONTINUE;
            END IF;
            -- A new statement, so a new snapshot taken after the lock was granted: the
            -- token and every answering append that committed while we waited.
            SELECT coalesce((SELECT f.token FROM loom_fences f
                             WHERE f.execution_id = p_id[i]), 0),
                   EXISTS (
                       SELECT 1 FROM loom_events e
                       WHERE e.execution_id = p_id[i]
                         AND e.sequence > p_seq[i]
                         AND (e.kind = ANY (p_answering)
                              OR (e.kind <> ALL (p_kernel)
                                  AND (e.metadata::jsonb) -> 'kernel' = 'true'::jsonb)))
            INTO cur, answered;
            o_token := cur;
            IF p_fence[i] <> cur OR answered THEN
                o_status := 3;
            ELSE
                -- Compare-and-set: only an acquire_fence that found no committed log to
                -- lock can have moved the token since the read.
                UPDATE loom_fences f SET token = cur + 1
                WHERE f.execution_id = p_id[i] AND f.token = cur;
                IF NOT FOUND THEN
                    INSERT INTO loom_fences (execution_id, token) VALUES (p_id[i], cur + 1)
                    ON CONFLICT DO NOTHING;
                END IF;
                IF FOUND THEN
                    o_status := 0;
                    o_token := cur + 1;
                ELSE
                    SELECT f.token INTO o_token
                    FROM loom_fences f WHERE f.execution_id = p_id[i];
                    o_status := 3;
                END IF;
            END IF;
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- The sequence guard: the head row serialises every writer of this execution.
        IF p_seq[i] = 0 THEN
            INSERT INTO loom_executions (execution_id, head) VALUES (p_id[i], n)
            ON CONFLICT DO NOTHING;
        ELSE
            UPDATE loom_executions e SET head = e.head + n
            WHERE e.execution_id = p_id[i] AND e.head = p_seq[i];
        END IF;
        IF NOT FOUND THEN
            SELECT e.head INTO hd FROM loom_executions e WHERE e.execution_id = p_id[i];
            o_head := coalesce(hd, 0);
            o_status := CASE WHEN p_seq[i] = 0 THEN 2 ELSE 1 END;
            IF p_op[i] = 'u' THEN
                -- append_if_unchanged judges the token before the sequence.
                SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id[i];
                o_token := coalesce(cur, 0);
                IF o_token <> p_fence[i] THEN
                    o_status := 3;
                END IF;
            END IF;
            RETURN NEXT;
            ev := ev + n;
            CONTINUE;
        END IF;

        -- The fence guard: a new statement after the head-row lock was granted, so it
        -- sees every token change that committed while we waited, and a later one
        -- waits for our commit.
        IF p_fence[i] IS NOT NULL THEN
            SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id[i];
            cur := coalesce(cur, 0);
            o_token := cur;
            IF cur <> p_fence[i] THEN
                -- Refused: put the head back, so the refused write changes nothing.
                IF p_seq[i] = 0 THEN
                    DELETE FROM loom_executions e WHERE e.execution_id = p_id[i];
                ELSE
                    UPDATE loom_executions e SET head = p_seq[i]
                    WHERE e.execution_id = p_id[i];
                END IF;
                o_head := p_seq[i];
                o_status := CASE WHEN p_fence[i] < cur OR p_op[i] = 'u' THEN 3 ELSE 6 END;
                RETURN NEXT;
                ev := ev + n;
                CONTINUE;
            END IF;
        END IF;

        o_at := clock_timestamp();
        FOR k IN 0 .. n - 1 LOOP
            w_event := w_event || (ev + k);
            w_id := w_id || p_id[i];
            w_seq := w_seq || (p_seq[i] + k);
            w_at := w_at || o_at;
        END LOOP;
        IF p_channel[i] IS NOT NULL THEN
            IF room IS NULL THEN
                room := pg_notification_queue_usage() < p_notify_limit;
            END IF;
            IF room THEN
                PERFORM pg_notify(p_channel[i], p_id[i]);
                o_notified := true;
            END IF;
        END IF;
        o_status := 0;
        o_head := p_seq[i] + n;
        RETURN NEXT;
        ev := ev + n;
    END LOOP;
    IF cardinality(w_event) > 0 THEN
        PERFORM loom_write_events(w_event, w_id, w_seq, w_at, p_kind, p_payload, p_metadata,
                                  p_writer);
    END IF;
END
$loom$
"""

# One write alone (append, append_if_unchanged, acquire_fence): what loom_batch does for
# an 'a', 'u' or 'f' write, statement for statement and status for status, with scalar
# parameters. A lone writer has nothing to coalesce, yet paid for adapting loom_batch's
# array parameters and for its loop on every call; so the store sends a batch of one such
# write here. The events come as one JSON array of [kind, payload, metadata] triples:
# ``->`` of a json value is the exact text of the element, so payloads are stored byte
# for byte as given. The protocol is loom_batch's (above): the head row is taken first,
# the token is read after that lock in a statement of its own, and a refused append puts
# the head back before it returns. (acquire_fence_if stays in loom_batch: its scan is the
# same either way, and it is the rarer call.)
_WRITE_ONE: Final = """
CREATE OR REPLACE FUNCTION loom_write_one(
    p_op "char", p_id text, p_seq bigint, p_fence bigint, p_count integer, p_events text,
    p_channel text, p_writer bigint, p_notify_limit double precision,
    OUT o_status smallint, OUT o_head bigint, OUT o_token bigint, OUT o_at timestamptz,
    OUT o_notified boolean
)
LANGUAGE plpgsql VOLATILE AS $loom$
DECLARE
    cur bigint;
    hd bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LM001',
            MESSAGE = format(
                'loom_write_one (append, append_if_unchanged, acquire_fence) runs only '
                'under READ COMMITTED, not %s', current_setting('transaction_isolation')),
            HINT = 'its fence guard needs a fresh snapshot after its head-row lock; call it '
                   'in a READ COMMITTED transaction (or autocommit)';
    END IF;
    o_notified := false;
    IF p_op = 'f' THEN
        -- The head row first (when there is a log): a token moves only under it.
        PERFORM 1 FROM loom_executions e WHERE e.execution_id = p_id FOR UPDATE;
        INSERT INTO loom_fences AS f (execution_id, token) VALUES (p_id, 1)
        ON CONFLICT (execution_id) DO UPDATE SET token = f.token + 1
        RETURNING f.token INTO o_token;
        o_status := 0;
        RETURN;
    END IF;
    -- The sequence guard: the head row serialises every writer of this execution.
    IF p_seq = 0 THEN
        INSERT INTO loom_executions (execution_id, head) VALUES (p_id, p_count)
        ON CONFLICT DO NOTHING;
    ELSE
        UPDATE loom_executions e SET head = e.head + p_count
        WHERE e.execution_id = p_id AND e.head = p_seq;
    END IF;
    IF NOT FOUND THEN
        SELECT e.head INTO hd FROM loom_executions e WHERE e.execution_id = p_id;
        o_head := coalesce(hd, 0);
        o_status := CASE WHEN p_seq = 0 THEN 2 ELSE 1 END;
        IF p_op = 'u' THEN
            -- append_if_unchanged judges the token before the sequence.
            SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id;
            o_token := coalesce(cur, 0);
            IF o_token <> p_fence THEN
                o_status := 3;
            END IF;
        END IF;
        RETURN;
    END IF;
    -- The fence guard: a new statement after the head-row lock was granted, so it sees
    -- every token change that committed while we waited, and a later one waits for our
    -- commit.
    IF p_fence IS NOT NULL THEN
        SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id;
        cur := coalesce(cur, 0);
        o_token := cur;
        IF cur <> p_fence THEN
            -- Refused: put the head back, so the refused write changes nothing.
            IF p_seq = 0 THEN
                DELETE FROM loom_executions e WHERE e.execution_id = p_id;
            ELSE
                UPDATE loom_executions e SET head = p_seq WHERE e.execution_id = p_id;
            END IF;
            o_head := p_seq;
            o_status := CASE WHEN p_fence < cur OR p_op = 'u' THEN 3 ELSE 6 END;
            RETURN;
        END IF;
    END IF;
    o_at := clock_timestamp();
    INSERT INTO loom_events
        (execution_id, sequence, kind, payload, metadata, recorded_at, writer)
    SELECT p_id, p_seq + e.n - 1, e.v ->> 0, e.v -> 1, e.v -> 2, o_at, p_writer
    FROM json_array_elements(p_events::json) WITH ORDINALITY AS e(v, n);
    IF p_channel IS NOT NULL AND pg_notification_queue_usage() < p_notify_limit THEN
        PERFORM pg_notify(p_channel, p_id);
        o_notified := true;
    END IF;
    o_status := 0;
    o_head := p_seq + p_count;
END
$loom$
"""

# append_many's fence guard: the current tokens of ``p_ids``, read by a query of its own.
# append_many is one statement, whose own snapshot is taken before it waits for its head
# rows; called after those locks are granted, this VOLATILE function's query takes a new
# snapshot (under READ COMMITTED, which it therefore insists on), so it sees a token that
# an acquirer committed, or a fence row it created, while the statement waited.
_FENCE_TOKENS: Final = """
CREATE OR REPLACE FUNCTION loom_fence_tokens(p_ids text[])
RETURNS TABLE (o_id text, o_token bigint)
LANGUAGE plpgsql VOLATILE AS $loom$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LM001',
            MESSAGE = format(
                'append_many (loom_fence_tokens) runs only under READ COMMITTED, not %s',
                current_setting('transaction_isolation')),
            HINT = 'its fence guard needs a fresh snapshot after its row locks; run it in '
                   'a READ COMMITTED transaction (or autocommit)';
    END IF;
    RETURN QUERY
    SELECT f.execution_id::text, f.token FROM loom_fences f
    WHERE f.execution_id = ANY (p_ids);
END
$loom$
"""

# The events of a batch's appends in one INSERT: a statement per write cost several
# times the guard itself. Its rows are the batch's event arrays (p_kind, p_payload,
# p_metadata) picked by position. plpgsql, not LANGUAGE sql: plpgsql keeps the INSERT's
# plan for the session, where a SQL function would plan it again on every call.
_WRITE_EVENTS: Final = """
CREATE OR REPLACE FUNCTION loom_write_events(
    p_event integer[], p_id text[], p_seq bigint[], p_at timestamptz[], p_kind text[],
    p_payload text[], p_metadata text[], p_writer bigint
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $loom$
BEGIN
    INSERT INTO loom_events
        (execution_id, sequence, kind, payload, metadata, recorded_at, writer)
    SELECT w.execution_id, w.sequence, e.kind, e.payload::json, e.metadata::json,
           w.recorded_at, p_writer
    FROM unnest(p_event, p_id, p_seq, p_at) AS w(event, execution_id, sequence, recorded_at)
    JOIN unnest(p_kind, p_payload, p_metadata) WITH ORDINALITY
         AS e(kind, payload, metadata, event) ON e.event = w.event;
END
$loom$
"""

_DELETE: Final = """
CREATE OR REPLACE FUNCTION loom_delete_execution(p_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $loom$
DECLARE
    existed boolean;
BEGIN
    -- The head row first, as every writer takes it (the lock order of loom_batch): the
    -- delete waits for in-flight appends and acquires, and they wait for it.
    DELETE FROM loom_executions e WHERE e.execution_id = p_id;
    existed := FOUND;
    DELETE FROM loom_events e WHERE e.execution_id = p_id;
    -- Then the fence row: the token moves one past its current value (0 -> 1 with no
    -- row), so every holder, the runner of the deleted log included, is stale on a
    -- re-created log of the same id. A delete that found no log changes no token.
    IF existed THEN
        INSERT INTO loom_fences AS f (execution_id, token) VALUES (p_id, 1)
        ON CONFLICT (execution_id) DO UPDATE SET token = f.token + 1;
    END IF;
    RETURN existed;
END
$loom$
"""

# Statuses: 0 done, 2 target exists, 4 source not found, 5 through_sequence past head.
_COPY: Final = """
CREATE OR REPLACE FUNCTION loom_copy_prefix(
    p_source text, p_target text, p_through bigint, p_channel text,
    p_notify_limit double precision
) RETURNS TABLE (o_status smallint, o_head bigint, o_copied bigint)
LANGUAGE plpgsql VOLATILE AS $loom$
DECLARE
    src bigint;
    copied bigint;
BEGIN
    SELECT e.head INTO src FROM loom_executions e WHERE e.execution_id = p_source FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 4::smallint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF p_through >= src THEN
        RETURN QUERY SELECT 5::smallint, src, 0::bigint;
        RETURN;
    END IF;
    INSERT INTO loom_executions (execution_id, head) VALUES (p_target, p_through + 1)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 2::smallint, e.head, 0::bigint
        FROM loom_executions e WHERE e.execution_id = p_target;
        RETURN;
    END IF;
    INSERT INTO loom_events
        (execution_id, sequence, kind, payload, metadata, recorded_at, writer)
    SELECT p_target, e.sequence, e.kind, e.payload, e.metadata, e.recorded_at, NULL
    FROM loom_events e
    WHERE e.execution_id = p_source AND e.sequence <= p_through;
    GET DIAGNOSTICS copied = ROW_COUNT;
    IF p_channel IS NOT NULL AND pg_notification_queue_usage() < p_notify_limit THEN
        PERFORM pg_notify(p_channel, p_target);
    END IF;
    RETURN QUERY SELECT 0::smallint, p_through + 1, copied;
END
$loom$
"""

# Statuses: 0 done, 4 not found, 5 keep_from_sequence past head.
_TRUNCATE: Final = """
CREATE OR REPLACE FUNCTION loom_truncate_prefix(p_id text, p_keep bigint)
RETURNS TABLE (o_status smallint, o_head bigint, o_dropped bigint)
LANGUAGE plpgsql VOLATILE AS $loom$
DECLARE
    hd bigint;
    dropped bigint;
BEGIN
    SELECT e.head INTO hd FROM loom_executions e WHERE e.execution_id = p_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 4::smallint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF p_keep > hd THEN
        RETURN QUERY SELECT 5::smallint, hd, 0::bigint;
        RETURN;
    END IF;
    DELETE FROM loom_events e WHERE e.execution_id = p_id AND e.sequence < p_keep;
    GET DIAGNOSTICS dropped = ROW_COUNT;
    RETURN QUERY SELECT 0::smallint, hd, dropped;
END
$loom$
"""

# Aborts the statement it is evaluated in (as a serialization failure, which the client
# re-runs) when a statement finds that a concurrent transaction invalidated its plan.
_RETRY_UNLESS: Final = """
CREATE OR REPLACE FUNCTION loom_retry_unless(p_ok boolean, p_why text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $loom$
BEGIN
    IF p_ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = p_why;
    END IF;
    RETURN true;
END
$loom$
"""

_FENCES_COMMENT: Final = """
    COMMENT ON TABLE loom_fences IS
    'Fence tokens. A row exists once someone acquires or a log is deleted (schema 1 and '
    '2 also wrote a token-0 row for every park; since schema 3 nothing needs one). A '
    'delete moves the token one past its current value. Nothing locks a row to read it: '
    'writers are ordered by the head row in loom_executions.'
    """

_STEP_1: Final = (
    """
    CREATE TABLE IF NOT EXISTS loom_executions (
        execution_id text COLLATE "C" PRIMARY KEY,
        head bigint NOT NULL CHECK (head >= 0)
    )
    """,
    # payload and metadata are json, not jsonb: the log returns exactly the text it was
    # given (jsonb would turn 1e300 into an integer and reorder keys), which hash chains
    # and signatures over the payload rely on.
    """
    CREATE TABLE IF NOT EXISTS loom_events (
        execution_id text COLLATE "C" NOT NULL,
        sequence bigint NOT NULL CHECK (sequence >= 0),
        kind text NOT NULL,
        payload json NOT NULL,
        metadata json NOT NULL,
        recorded_at timestamptz NOT NULL,
        writer bigint,
        PRIMARY KEY (execution_id, sequence)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS loom_fences (
        execution_id text COLLATE "C" PRIMARY KEY,
        token bigint NOT NULL CHECK (token >= 0)
    )
    """,
    _FENCES_COMMENT,
    """
    COMMENT ON COLUMN loom_events.writer IS
    'Random id of the commit that wrote the row: after a lost connection the store '
    'checks it to learn whether its append landed.'
    """,
    """
    CREATE TABLE IF NOT EXISTS loom_leases (
        key text COLLATE "C" PRIMARY KEY,
        holder text NOT NULL,
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    )
    """,
    _TIMERS,
    _RETRY_UNLESS,
    _WRITE_EVENTS,
    _BATCH,
    _ACQUIRE_FENCE_IF,
    _DELETE,
    _COPY,
    _TRUNCATE,
)

# Schema 3: writers are ordered by the head row (see the protocol above loom_batch), so
# no fence row is locked and none is needed for a park. loom_batch loses p_lock and
# p_park, loom_copy_prefix p_park_kind, and loom_acquire_fence_if returns the status: the
# old signatures are dropped, so no caller keeps running the old protocol.
_STEP_3: Final = (
    'DROP FUNCTION IF EXISTS loom_batch("char"[], text[], bigint[], bigint[], boolean[], '
    "boolean[], integer[], text[], text[], text[], text[], bigint, text[], text[], "
    "double precision)",
    "DROP FUNCTION IF EXISTS loom_acquire_fence_if(text, bigint, bigint, text[], text[])",
    "DROP FUNCTION IF EXISTS loom_copy_prefix(text, text, bigint, text, text, "
    "double precision)",
    _BATCH,
    _FENCE_TOKENS,
    _ACQUIRE_FENCE_IF,
    _DELETE,
    _COPY,
    _FENCES_COMMENT,
)

MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    (1, "events, fences, timers (with redrive), leases; loom_batch", _STEP_1),
    (2, "loom_batch writes a batch's events in one INSERT", (_WRITE_EVENTS, _BATCH)),
    (3, "writers ordered by the head row: no fence-row locks, no park fence rows", _STEP_3),
    (4, "loom_write_one: one write alone, with scalar parameters", (_WRITE_ONE,)),
    (5, "loom_delete_execution moves the token one past its current value",
     (_DELETE, _FENCES_COMMENT)),
)
assert MIGRATIONS[-1][0] == SCHEMA_VERSION

STATE: Final = "SELECT max(version) FROM loom_schema_version"

# The catalogs are readable by every role, so this finds a version table in a schema the
# role may not use (search_path passes over such a schema, and the table looks absent).
UNUSABLE: Final = """
SELECT current_user
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = 'loom_schema_version'
  AND NOT has_schema_privilege(n.oid, 'USAGE')
"""

@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What a :func:`~loom_postgres.migrate` call did."""

    schema: str
    version_before: int
    version_after: int
    backfilled_park_fences: int | None
    """Always None since schema 3: parks need no fence row, so there is no backfill (the
    field stays for callers that read it)."""


async def schema_state(conn: Connection) -> int:
    """The schema version of the connection's schema; 0 if there is none."""
    try:
        async with conn.transaction():
            cur = await conn.execute(STATE)
            row = await cur.fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    assert row is not None
    return int(row[0] or 0)


async def refuse_unusable(conn: Connection, schema: str) -> None:
    """Raise SchemaMigrationError if ``schema`` holds the Loom tables but the role may not
    use it: its version then reads as 0, and a migration would be the wrong remedy."""
    row = await (await conn.execute(UNUSABLE, (schema,))).fetchone()
    if row is None:
        return
    raise SchemaMigrationError(
        f"the Loom tables in schema {schema!r} exist, but role {row[0]!r} may not use that "
        f"schema; nothing was changed. Have the schema's owner GRANT USAGE ON SCHEMA "
        f"{schema} TO {row[0]} (with SELECT, INSERT, UPDATE, DELETE on its tables and "
        "EXECUTE on its functions), or connect as a role that may use it"
    )


async def migrate_connection(
    conn: Connection,
    *,
    schema: str | None,
    lock_timeout: float,
) -> MigrationReport:
    """Create or migrate the schema on ``conn`` (autocommit) in one transaction under the
    advisory lock; see :func:`loom_postgres.migrate`. A schema a newer loom-postgres
    migrated is refused (SchemaTooNewError) and the transaction rolled back."""
    try:
        async with conn.transaction():
            name_row = await (await conn.execute("SELECT current_schema()")).fetchone()
            target = schema or (name_row[0] if name_row else None) or "public"
            # The DDL below may wait for table locks only this long, and is exempt from
            # the caller's statement_timeout.
            await conn.execute(
                "SELECT set_config('lock_timeout', %s, true), "
                "set_config('statement_timeout', '0', true)",
                (f"{max(1, round(lock_timeout * 1000))}ms",),
            )
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                (ADVISORY_CLASS, f"loom:migrate:{target}"),
            )
            if schema is not None:
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
            for statement in _BOOKKEEPING:
                await conn.execute(statement)
            row = await (await conn.execute(STATE)).fetchone()
            assert row is not None
            before = int(row[0] or 0)
            if before > SCHEMA_VERSION:
                # Raised inside the transaction: the bookkeeping above is rolled back.
                raise SchemaTooNewError(target, before, SCHEMA_VERSION)
            for version, description, statements in MIGRATIONS:
                if version <= before:
                    continue
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO loom_schema_version (version, description) VALUES (%s, %s)",
                    (version, description),
                )
    except psycopg.errors.LockNotAvailable as exc:
        raise SchemaMigrationError(
            f"migrating the Loom schema waited longer than migration_lock_timeout "
            f"({lock_timeout}s) for a table lock: {exc}; nothing was changed, retry the "
            "boot (or raise migration_lock_timeout)"
        ) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SchemaMigrationError(
            f"the database role may not create the Loom schema: {exc}; run "
            "loom_postgres.migrate() once as a role that may, then boot again"
        ) from exc
    except psycopg.Error as exc:
        # A read-only database (a standby, default_transaction_read_only), a full disk, a
        # lost connection: the one transaction rolled back whole.
        raise SchemaMigrationError(
            f"migrating the Loom schema failed ({describe(exc)}); nothing was changed; "
            "fix the cause (is this the primary, writable, and reachable?) and retry the "
            "boot"
        ) from exc
    after = max(before, SCHEMA_VERSION)
    return MigrationReport(target, before, after, None)
