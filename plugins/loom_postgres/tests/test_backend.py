"""What the PostgreSQL backend adds over the kit's contract: the URL schemes and options,
group commit, cross-node subscribe through LISTEN/NOTIFY, the READ COMMITTED guard of
loom_acquire_fence_if, leases on the database clock, and the test harness itself."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import loom_postgres
import psycopg
import pytest
from loom_conformance.postgres import (
    PostgresServer,
    find_postgres_bindir,
    in_ci,
    with_database,
)
from loom_postgres import ConnectionRejectedError, PostgresEventStore, migrate
from loom_postgres.database import PooledConnection
from loom_postgres.events import BATCH
from loom_postgres.schema import ANSWERING_LITERAL, KERNEL_LITERAL
from loom_postgres.storage import check_url, redact
from psycopg import sql

from loom_core import AppendRequest, Event, JsonValue, NewEvent, Storage, open_storage
from loom_core.errors import (
    InvalidOptionError,
    InvalidURLError,
    SequenceConflictError,
    StaleFenceError,
    StorageError,
    StorageUnavailableError,
)
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, PluginHost, json_text

Opener = Callable[..., Awaitable[Storage]]
Conn = psycopg.AsyncConnection[tuple[object, ...]]


# -- schemes and options -----------------------------------------------------------------


def test_the_entry_point_registers_both_url_schemes() -> None:
    host = PluginHost()
    assert {"postgresql", "postgres"} <= set(host.backends.factories)
    assert host.backends.source_of("postgresql") == "loom-postgres"


async def test_every_optional_method_is_offered(open_pg: Opener) -> None:
    # So the kit runs every optional-method case against this store and skips none.
    storage = await open_pg()
    assert storage.events.capabilities == frozenset(OPTIONAL_EVENT_STORE_METHODS)


async def test_postgres_scheme_opens_the_same_backend(pg_url: str, schema: str) -> None:
    url = "postgres://" + pg_url.split("://", 1)[1]
    async with open_storage(url, options={"schema": schema}) as storage:
        assert isinstance(storage.events, PostgresEventStore)
        assert storage.leases.scope == "cluster"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pool_size": 3}, "unknown postgresql:// options"),
        ({"pool_max_size": "10"}, "pool_max_size must be an int"),
        ({"notify_buckets": -1}, "notify_buckets must be >= 0"),
        ({"schema": "Robert'); DROP TABLE x;--"}, "schema must be lowercase"),
        ({"schema": "loom\n"}, "schema must be lowercase"),
        ({"schema": 'lo"om; DROP SCHEMA public'}, "schema must be lowercase"),
        ({"lock_timeout": 0}, "lock_timeout must be finite and > 0"),
        ({"notify_queue_limit": 2}, "within"),
        ({"max_inflight_batches": 10, "pool_max_size": 10}, "below pool_max_size"),
    ],
)
async def test_bad_options_are_refused_before_connecting(
    options: dict[str, object], match: str
) -> None:
    # The host does not exist: an option error must come first, without a connection.
    with pytest.raises(InvalidOptionError, match=match):
        await open_storage("postgresql://nobody@192.0.2.1:1/x", options=options)


async def test_a_malformed_url_is_an_invalid_url_error() -> None:
    with pytest.raises(InvalidURLError):
        await open_storage("postgresql://u@h/db?no_such_param=1")


async def test_an_unknown_parameter_is_named_with_what_the_linked_libpq_knows() -> None:
    with pytest.raises(InvalidURLError) as caught:
        await open_storage("postgresql://u@h/db?sslmod=require")
    message = str(caught.value)
    assert "unknown parameter 'sslmod'; did you mean 'sslmode'?" in message
    # The list is the linked libpq's own, so it is never older than the libpq in use.
    assert "the libpq psycopg uses (version " in message
    for known in ("sslmode", "target_session_attrs", "application_name"):
        assert known in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("require_auth=bogus", 'invalid require_auth value: "bogus"'),
        ("require_auth=password,password", "specified more than once"),
        ("require_auth=!password,md5", "cannot be mixed"),
        ("ssl_min_protocol_version=TLSv9", "ssl_min_protocol_version"),
        ("ssl_max_protocol_version=tls13", "ssl_max_protocol_version"),
    ],
)
async def test_a_value_only_libpq_checks_is_an_invalid_url_error_at_once(
    query: str, match: str
) -> None:
    # check_url does not know these values; libpq refuses them before it connects, and
    # that refusal is not retried for connect_timeout (nor taken for an unreachable
    # server) either.
    url = f"postgresql://u:secret@192.0.2.1/db?{query}"
    with pytest.raises(InvalidURLError, match=match) as caught:
        await open_storage(url, options={"connect_timeout": 1})
    assert "secret" not in str(caught.value)
    with pytest.raises(InvalidURLError, match=match):
        await migrate(url)


def test_a_scram_key_given_as_a_query_parameter_is_masked() -> None:
    url = "postgresql://u@h/db?scram_client_key=Y2xpZW50&scram_server_key=c2VydmVy&sslmode=prefer"
    assert redact(url) == (
        "postgresql://u@h/db?scram_client_key=***&scram_server_key=***&sslmode=prefer"
    )


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("postgresql://u@192.0.2.1:notaport/db", "port 'notaport' is not a number"),
        ("postgresql://u@192.0.2.1:99999/db", "port '99999' is not a number"),
        ("postgresql://u@192.0.2.1:0/db", "port '0' is not a number"),
        ("postgresql://u@192.0.2.1:5432,192.0.2.2:x/db", "port 'x' is not a number"),
        ("postgresql://u@192.0.2.1/db?sslmode=requir", "sslmode 'requir' is not one of"),
        ("postgresql://u@192.0.2.1/db?connect_timeout=ten", "connect_timeout 'ten'"),
        ("postgresql://u@192.0.2.1/db?target_session_attrs=rw", "target_session_attrs"),
    ],
)
async def test_a_value_libpq_would_refuse_is_an_invalid_url_error_before_connecting(
    url: str, match: str
) -> None:
    # Retrying cannot mend a typo: it is refused at once, not after connect_timeout of
    # connection attempts that all fail the same way.
    with pytest.raises(InvalidURLError, match=match):
        await open_storage(url, options={"connect_timeout": 1})


def test_the_url_check_accepts_what_libpq_accepts() -> None:
    for url in (
        "postgresql://u@h1:5432,h2/db?sslmode=verify-full&target_session_attrs=read-write",
        "postgresql://u@h/db?connect_timeout=5&keepalives_idle=10&tcp_user_timeout=30000",
        "postgresql:///db?host=/var/run/postgresql&port=5433",
    ):
        assert check_url(url) == url


async def test_the_scheme_is_case_insensitive_as_for_every_backend(
    pg_url: str, schema: str
) -> None:
    # open_storage picks this backend for POSTGRESQL:// as for postgresql://; libpq
    # itself knows only the lower-case prefixes, and read the rest as key=value pairs.
    scheme, rest = pg_url.split("://", 1)
    for i, url in enumerate((f"{scheme.upper()}://{rest}", f"Postgres://{rest}")):
        async with open_storage(url, options={"schema": f"{schema}_{i}"}) as storage:
            await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
            assert await storage.events.head("e") == 1
            assert storage.url == f"{url.split('://')[0].lower()}://{rest}"


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII"])
async def test_a_database_not_in_utf8_is_refused_before_anything_is_written(
    loom_postgres_server: PostgresServer, encoding: str
) -> None:
    # LATIN1 cannot hold most ids and payloads; SQL_ASCII hands text back as bytes, so
    # ids would list as "b'...'". Either is refused at open, with nothing created.
    name = f"loom_{encoding.lower()}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(loom_postgres_server.url, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} TEMPLATE template0 ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C'"
            ).format(sql.Identifier(name), sql.Literal(encoding))
        )
    url = with_database(loom_postgres_server.url, name)
    with pytest.raises(InvalidURLError, match=f"encoding {encoding}.*UTF8"):
        await open_storage(url, options={"schema": "loom"})
    with pytest.raises(InvalidURLError, match=f"encoding {encoding}.*UTF8"):
        await loom_postgres.migrate(url, schema="loom")
    with psycopg.connect(url) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'loom'"
        ).fetchone()
    assert made == (0,)


async def test_a_client_encoding_in_the_url_changes_nothing_stored_or_read(
    pg_url: str, schema: str
) -> None:
    # The store's sessions talk UTF8 whatever the URL asks: in LATIN1 an emoji would not
    # even be sent.
    async with open_storage(
        f"{pg_url}?client_encoding=LATIN1", options={"schema": schema}
    ) as storage:
        await storage.events.append("é😀", [NewEvent("A", {"v": "ü😀"})], expected_sequence=0)
        assert await storage.events.list_executions() == ("é😀",)
        assert [e.payload for e in await storage.events.read("é😀")] == [{"v": "ü😀"}]


async def test_an_unreachable_server_is_storage_unavailable_and_names_no_password() -> None:
    with pytest.raises(StorageUnavailableError) as caught:
        await open_storage(
            "postgresql://user:secret@127.0.0.1:1/db", options={"connect_timeout": 1}
        )
    assert "secret" not in str(caught.value)


async def test_a_password_given_as_a_query_parameter_is_masked_too(pg_url: str) -> None:
    # libpq takes the password in the query as well; neither an error nor Storage.url
    # may show it.
    with pytest.raises(StorageUnavailableError) as caught:
        await open_storage(
            "postgresql://user@127.0.0.1:1/db?password=secret&sslpassword=keysecret",
            options={"connect_timeout": 1},
        )
    assert "secret" not in str(caught.value)
    assert "password=***&sslpassword=***" in str(caught.value)
    async with open_storage(f"{pg_url}?password=secret", options={"schema": "masked"}) as s:
        assert s.url == f"{pg_url}?password=***"


async def test_the_urls_connect_timeout_is_kept_unless_the_option_sets_one(pg_url: str) -> None:
    # libpq takes connect_timeout from the URL; the pool's own must not override it.
    for query, options, seconds in (
        ("?connect_timeout=3", {}, 3.0),
        ("?connect_timeout=3", {"connect_timeout": 5}, 5.0),
        ("?connect_timeout=0", {}, 10.0),  # libpq's "no limit": opening must end
        ("", {}, 10.0),
    ):
        async with open_storage(pg_url + query, options={**options, "schema": "timeouts"}) as s:
            assert isinstance(s.events, PostgresEventStore)
            assert s.events._db.options.connect_timeout == seconds, query


async def test_a_database_that_does_not_exist_is_refused_at_once_saying_why(
    pg_url: str,
) -> None:
    # Waiting cannot create it: refused by the first try, not after connect_timeout, with
    # the server's own reason. (Passwords and roles: test_login.py.)
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_database_here"
    with pytest.raises(ConnectionRejectedError, match='"no_such_database_here" does not exist'):
        await open_storage(missing, options={"connect_timeout": 1})


# -- group commit --------------------------------------------------------------------------


async def test_a_write_that_finds_no_connection_names_its_operation_and_execution(
    open_pg: Opener,
) -> None:
    # Every connection of the pool is held here, so the writes never get one.
    storage = await open_pg(pool_min_size=2, pool_max_size=2, max_inflight_batches=1,
                            reconnect_timeout=0.2)
    events = storage.events
    assert isinstance(events, PostgresEventStore)
    pool = events._db.pool
    held = [await pool.getconn(), await pool.getconn()]
    try:
        with pytest.raises(StorageUnavailableError) as appended:
            await events.append("order-7", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
        with pytest.raises(StorageUnavailableError) as acquired:
            await events.acquire_fence("order-8")
    finally:
        for conn in held:
            await pool.putconn(conn)
    assert "append on 'order-7'" in str(appended.value)
    assert "acquire_fence on 'order-8'" in str(acquired.value)
    assert await events.head("order-7") == 0


async def test_concurrent_appends_share_commits_but_keep_their_own_results(
    open_pg: Opener,
) -> None:
    storage = await open_pg()
    events = storage.events
    assert isinstance(events, PostgresEventStore)
    await events.append("conflict", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
    await events.acquire_fence("stale")
    await events.acquire_fence("stale")
    before = events.group_commit.batches

    async def one(i: int) -> object:
        if i == 7:  # a sequence conflict in the middle of the crowd
            return await events.append("conflict", [NewEvent("X")], expected_sequence=5)
        if i == 13:  # a stale fence
            return await events.append("stale", [NewEvent("X")], expected_sequence=0, fence=1)
        return await events.append(f"crowd-{i}", [NewEvent("X", {"i": i})], expected_sequence=0)

    results = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
    batches = events.group_commit.batches - before
    assert batches < 200  # coalesced
    assert isinstance(results[7], SequenceConflictError)
    assert results[7].actual_head == 1
    assert isinstance(results[13], StaleFenceError)
    assert results[13].current_fence == 2
    for i, result in enumerate(results):
        if i in (7, 13):
            continue
        assert not isinstance(result, BaseException), result
        assert (await events.read(f"crowd-{i}"))[0].payload == {"i": i}
    assert await events.head("conflict") == 1
    assert await events.head("stale") == 0


async def test_a_failing_write_does_not_take_its_batch_mates_down(
    open_pg: Opener, pg_url: str, schema: str
) -> None:
    storage = await open_pg(schema=schema, lock_timeout=0.3)
    events = storage.events
    await events.append("blocked", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
    holder = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await holder.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await holder.execute(
            "SELECT 1 FROM loom_executions WHERE execution_id = 'blocked' FOR UPDATE"
        )
        # Fill the in-flight slots first so the rest queue and leave as one batch.
        writes = [
            events.append("blocked", [NewEvent("X")], expected_sequence=1),
            *(events.append(f"mate-{i}", [NewEvent("X")], expected_sequence=0)
              for i in range(30)),
        ]
        results = await asyncio.gather(*writes, return_exceptions=True)
    finally:
        await holder.rollback()
        await holder.close()
    assert isinstance(results[0], StorageError)
    assert all(not isinstance(r, BaseException) for r in results[1:])
    assert await events.head("blocked") == 1


async def test_every_write_on_a_pooled_connection_runs_on_its_one_write_cursor(
    open_pg: Opener,
) -> None:
    storage = await open_pg(pool_min_size=2, pool_max_size=2, max_inflight_batches=1)
    events = storage.events
    assert isinstance(events, PostgresEventStore)
    pool = events._db.pool
    held = await pool.getconn()  # so that every write below gets the other connection
    try:
        conn = await pool.getconn()
        assert isinstance(conn, PooledConnection)
        cursor = conn.write_cursor()
        await pool.putconn(conn)
        for sequence in range(3):
            await events.append("one", [NewEvent("STEP_COMPLETED")], expected_sequence=sequence)
            assert conn.write_cursor() is cursor
            assert cursor.rowcount == 1  # it ran that append: one answer row
        assert held.write_cursor() is not cursor
    finally:
        await pool.putconn(held)
    assert [e.sequence for e in await events.read("one")] == [0, 1, 2]


async def test_cancelling_a_lone_append_cancels_its_statement_and_writes_nothing(
    open_pg: Opener, pg_url: str, schema: str, admin: Conn
) -> None:
    # A lone write runs in its caller's task, so cancelling the caller reaches the
    # statement: here it is blocked on a head row the test holds, and is cancelled there.
    storage = await open_pg(schema=schema)
    events = storage.events
    assert isinstance(events, PostgresEventStore)
    await events.append("held", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
    holder = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await holder.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await holder.execute(
            "SELECT 1 FROM loom_executions WHERE execution_id = 'held' FOR UPDATE"
        )
        append = asyncio.create_task(
            events.append("held", [NewEvent("STEP_COMPLETED")], expected_sequence=1)
        )
        async with asyncio.timeout(60):  # a hang guard, not a measurement
            while True:
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE '%%loom_write_one%%'"
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 1:
                    break
                assert not append.done()
                await asyncio.sleep(0.002)
        append.cancel()
        with pytest.raises(asyncio.CancelledError):
            await append
    finally:
        await holder.rollback()
        await holder.close()
    assert [e.kind for e in await events.read("held")] == ["EXECUTION_STARTED"]
    # Nothing is left in flight and the connection went back whole: the next write runs.
    written = await events.append("held", [NewEvent("STEP_COMPLETED")], expected_sequence=1)
    assert [e.sequence for e in written] == [1]
    assert [e.kind for e in await events.read("held")] == ["EXECUTION_STARTED", "STEP_COMPLETED"]


# -- the READ COMMITTED guard -----------------------------------------------------------


async def test_stored_metadata_is_the_encoders_text_whatever_its_shape(
    open_pg: Opener, pg_url: str, schema: str
) -> None:
    storage = await open_pg(schema=schema)
    token = await storage.events.acquire_fence("m")
    # Fenced on odd sequences: the token is stamped after the caller's keys, which keep
    # their order (a read hands back what append did).
    shapes: list[dict[str, JsonValue]] = [
        {},
        {},
        {"kernel": True},
        {"zeta": 1, "alpha": ["é", None, 2.5]},
        {"fencing": 3},
    ]
    for sequence, metadata in enumerate(shapes):
        await storage.events.append(
            "m", [NewEvent("STEP_COMPLETED", None, metadata)], expected_sequence=sequence,
            fence=token if sequence % 2 else None,
        )
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        cursor = await conn.execute(
            "SELECT metadata::text FROM loom_events WHERE execution_id = 'm' ORDER BY sequence"
        )
        stored = [str(row[0]) for row in await cursor.fetchall()]
    expected = [
        json_text({**m, "fence": token} if i % 2 else m) for i, m in enumerate(shapes)
    ]
    assert stored == expected
    assert stored[:2] == ["{}", f'{{"fence":{token}}}']


async def test_acquire_fence_if_function_refuses_repeatable_read(
    open_pg: Opener, pg_url: str, schema: str
) -> None:
    await open_pg(schema=schema)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error, match="only under READ COMMITTED"):
            await conn.execute(
                "SELECT * FROM loom_acquire_fence_if('x', 0, 0, ARRAY['A'], ARRAY['A'])"
            )


async def test_a_conditional_acquire_sees_an_answer_earlier_in_its_own_batch(
    open_pg: Opener, pg_url: str, schema: str
) -> None:
    storage = await open_pg(schema=schema)
    park = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]
    for execution_id in ("x", "y", "z"):
        await storage.events.append(execution_id, park, expected_sequence=0)
    # One loom_batch: x is answered and then conditionally acquired (stale: the answer is
    # part of the same batch); y is answered and z, untouched, is acquired.
    ops = ["a", "c", "a", "c"]
    ids = ["x", "x", "y", "z"]
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        cursor = await conn.execute(
            BATCH,
            (ops, ids, [2, 1, 2, 1], [None, 0, None, 0], [1, 0, 1, 0],
             ["EXECUTION_RESUMED"] * 2, ["null"] * 2, ["{}"] * 2, [None] * 4, 7,
             ANSWERING_LITERAL, KERNEL_LITERAL, 0.5),
        )
        rows = await cursor.fetchall()
    # (status, token): an unfenced append reads no token.
    assert [(row[0], row[2]) for row in rows] == [(0, None), (3, 0), (0, None), (0, 1)]
    assert [e.kind for e in await storage.events.read("x")][-1] == "EXECUTION_RESUMED"
    assert await storage.events.acquire_fence("x") == 1  # the stale acquire changed nothing


async def test_a_server_defaulting_to_repeatable_read_still_fences_correctly(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_rr")
    name = url.rsplit("/", 1)[1]
    async with await psycopg.AsyncConnection.connect(
        loom_postgres_server.url, autocommit=True
    ) as conn:
        await conn.execute(
            psycopg.sql.SQL(
                "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'"
            ).format(psycopg.sql.Identifier(name))
        )
    async with open_storage(url) as storage:
        park = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]
        await storage.events.append("rr", park, expected_sequence=0)
        acquired = await storage.events.acquire_fence_if("rr", fence=0, park_seq=1)
        assert acquired.acquired
        assert acquired.fence == 1
        # The appends' fence guards need the same fresh snapshots, on both paths.
        with pytest.raises(StaleFenceError):
            await storage.events.append("rr", [NewEvent("EXECUTION_RESUMED")],
                                        expected_sequence=2, fence=0)
        await storage.events.append("rr", [NewEvent("EXECUTION_RESUMED")],
                                    expected_sequence=2, fence=1)
        await storage.events.append_many(
            [AppendRequest("rr", [NewEvent("STEP_COMPLETED")], 3, fence=1)]
        )
        assert await storage.events.head("rr") == 4


# -- subscribe across nodes ---------------------------------------------------------------


async def _collect(storage: Storage, eid: str, count: int) -> list[int]:
    out: list[int] = []
    async for event in storage.events.subscribe(eid):
        out.append(event.sequence)
        if len(out) == count:
            break
    return out


async def test_subscriber_on_another_node_is_woken_by_notify(open_pg: Opener, schema: str) -> None:
    # A long poll interval: only a NOTIFY can deliver these in time.
    reader = await open_pg(schema=schema, subscribe_poll_interval=60.0)
    writer = await open_pg(schema=schema)
    await writer.events.append("live", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
    task = asyncio.create_task(_collect(reader, "live", 4))
    await asyncio.sleep(0.3)
    for seq in range(1, 4):
        await writer.events.append("live", [NewEvent("STEP_COMPLETED")], expected_sequence=seq)
    assert await asyncio.wait_for(task, 10) == [0, 1, 2, 3]


async def test_without_notify_buckets_a_subscriber_still_gets_everything_by_polling(
    open_pg: Opener, schema: str
) -> None:
    reader = await open_pg(schema=schema, notify_buckets=0, subscribe_poll_interval=0.1)
    writer = await open_pg(schema=schema, notify_buckets=0)
    task = asyncio.create_task(_collect(reader, "polled", 3))
    for seq in range(3):
        await writer.events.append("polled", [NewEvent("X")], expected_sequence=seq)
    assert await asyncio.wait_for(task, 10) == [0, 1, 2]


async def test_a_subscriber_that_stops_reading_does_not_block_commits(
    open_pg: Opener, schema: str
) -> None:
    storage = await open_pg(schema=schema)
    iterator = storage.events.subscribe("busy")
    async def next_event() -> Event:
        return await anext(iterator)

    first = asyncio.create_task(next_event())
    await storage.events.append("busy", [NewEvent("X")], expected_sequence=0)
    assert (await asyncio.wait_for(first, 5)).sequence == 0
    # The subscriber stops reading; a thousand appends still commit promptly.
    for seq in range(1, 1001):
        await storage.events.append("busy", [NewEvent("X")], expected_sequence=seq)
    assert await storage.events.head("busy") == 1001
    # When it resumes it gets every event, in order, from where it stopped.
    seen = [(await anext(iterator)).sequence for _ in range(1000)]
    assert seen == list(range(1, 1001))
    await iterator.aclose()  # type: ignore[attr-defined]


async def test_a_foreign_listener_that_stops_reading_makes_appends_skip_wake_ups(
    open_pg: Opener, pg_url: str, schema: str
) -> None:
    warnings: list[str] = []
    storage = await open_pg(schema=schema, notify_queue_limit=1e-9, on_warn=warnings.append)
    other = await open_pg(schema=schema)
    # A listening session that sits in an open transaction never consumes: the queue's
    # tail stays behind it, so usage grows as others notify.
    stuck = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    try:
        await stuck.execute("LISTEN loom_test_stuck")
        await stuck.execute("BEGIN")
        await stuck.execute("SELECT 1")
        await asyncio.gather(
            *(other.events.append(f"fill-{i}", [NewEvent("X")], expected_sequence=0)
              for i in range(400))
        )
        await other.events.append("q", [NewEvent("X")], expected_sequence=0)
        for seq in range(1, 50):
            await storage.events.append("q", [NewEvent("X")], expected_sequence=seq)
    finally:
        await stuck.rollback()
        await stuck.close()
    assert await storage.events.head("q") == 50
    assert len(warnings) == 1  # at most once a minute
    assert "NOTIFY queue" in warnings[0]


# -- leases -------------------------------------------------------------------------------


async def test_lease_expiry_follows_the_database_clock(open_pg: Opener) -> None:
    storage = await open_pg()
    lease = await storage.leases.acquire("job", "node-a", ttl_seconds=0.3)
    assert lease.expires_at - lease.acquired_at == timedelta(seconds=0.3)
    assert (await storage.leases.inspect("job")) == lease
    await asyncio.sleep(0.5)
    assert await storage.leases.inspect("job") is None
    taken = await storage.leases.acquire("job", "node-b", ttl_seconds=5)
    assert taken.holder == "node-b"


# -- the harness --------------------------------------------------------------------------


def test_the_throwaway_server_runs_unprivileged_on_loopback(
    loom_postgres_server: PostgresServer,
) -> None:
    if loom_postgres_server.cluster is None:
        pytest.skip("LOOM_TEST_POSTGRES_URL names an external server")
    cluster = loom_postgres_server.cluster
    assert cluster.root is not None
    owner = (cluster.data_dir / "PG_VERSION").stat().st_uid
    assert owner != 0 or os.geteuid() != 0
    with psycopg.connect(cluster.url) as conn:
        row = conn.execute("SELECT current_setting('listen_addresses')").fetchone()
    assert row == ("127.0.0.1",)


KILLED_OWNER = """
import os, signal
from loom_conformance.postgres import ThrowawayCluster

cluster = ThrowawayCluster()
cluster.start()
print(cluster.root, cluster.port, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no atexit
"""


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_cluster_whose_owner_is_killed_is_stopped_and_deleted() -> None:
    if find_postgres_bindir() is None and not in_ci():
        pytest.skip("no PostgreSQL binaries on this machine")
    owner = subprocess.run(
        [sys.executable, "-c", KILLED_OWNER], capture_output=True, text=True, timeout=120
    )
    assert owner.returncode == -9, owner.stderr
    root, port = owner.stdout.split()
    deadline = time.monotonic() + 30
    while (Path(root).exists() or _accepts(int(port))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _accepts(int(port)), "the server outlived the process that started it"
    assert not Path(root).exists(), "the cluster's directory was left behind"


HARNESS_PROBE = """
from loom_conformance.postgres import loom_postgres_server  # noqa: F401

def test_needs_server(loom_postgres_server):
    pass
"""


@pytest.mark.parametrize(("ci", "outcome"), [("true", "error"), ("", "skipped")])
def test_a_missing_server_fails_under_ci_and_skips_elsewhere(
    tmp_path: object, ci: str, outcome: str
) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path))
    (directory / "test_probe.py").write_text(HARNESS_PROBE)
    empty = directory / "no-postgres"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "LOOM_TEST_POSTGRES_URL"}}
    env.update(CI=ci, LOOM_TEST_POSTGRES_BIN=str(empty))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_probe.py"],
        cwd=directory, env=env, capture_output=True, text=True, timeout=120,
    )
    assert f"1 {outcome}" in result.stdout, result.stdout + result.stderr


async def test_a_client_encoding_in_the_url_does_not_break_the_listen_connection(
    pg_url: str, schema: str
) -> None:
    # A notification carries the execution id: in the URL's LATIN1 the server could not
    # send "é😀" and ended the LISTEN connection (a warning, then polling until it was back).
    reader = await open_storage(
        f"{pg_url}?client_encoding=LATIN1",
        options={"schema": schema, "subscribe_poll_interval": 60.0},
    )
    writer = await open_storage(pg_url, options={"schema": schema})
    try:
        await writer.events.append("é😀", [NewEvent("A")], expected_sequence=0)
        first = asyncio.Event()
        seen: list[int] = []

        async def collect() -> None:
            async for event in reader.events.subscribe("é😀"):
                seen.append(event.sequence)
                first.set()
                if len(seen) == 2:
                    return

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task = asyncio.create_task(collect())
            await first.wait()
            await writer.events.append("é😀", [NewEvent("B")], expected_sequence=1)
            await asyncio.wait_for(task, 60)
        assert seen == [0, 1]
        assert not [w for w in caught if "LISTEN connection failed" in str(w.message)]
    finally:
        await reader.close()
        await writer.close()
