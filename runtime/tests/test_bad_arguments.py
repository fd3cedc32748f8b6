"""Bad arguments to the durable calls' durations, to Retry and to the test kit are refused
with a typed error that says what to do, and nothing is written."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from loom_runtime import (
    Context,
    Durable,
    InvalidDurationError,
    Loom,
    Retry,
    StepFailedError,
    TimerService,
    WorkflowFailedError,
)
from loom_runtime.clock import LATEST_DEADLINE, MAX_DURATION
from loom_runtime.testing import CrashAt, VirtualClock, check_replay, crash_at

from loom_core import EventKind, InvalidExecutionIdError, InvalidInputError, InvalidOptionError


def _refusals(
    app: Loom, calls: list[Callable[[Context], object]], execution_id: str
) -> Callable[[Context], Awaitable[list[list[str]]]]:
    """A workflow that makes each call and records what refused it, by type and message."""

    @app.workflow(name=execution_id)
    async def careless(ctx: Context) -> list[list[str]]:
        refused: list[list[str]] = []
        for call in calls:
            try:
                accepted = call(ctx)
            except Exception as exc:
                refused.append([type(exc).__name__, str(exc)])
            else:
                assert isinstance(accepted, Durable)
                accepted.close()  # not awaited: the test wants only the check
                refused.append(["accepted", ""])
        return refused

    return careless


async def _run_refusals(
    app: Loom, calls: list[Callable[[Context], object]], execution_id: str
) -> list[list[str]]:
    body = _refusals(app, calls, execution_id)
    handle = await app.start(body, id=execution_id)
    result = await handle.result(timeout=5)
    kinds = [e.kind for e in await app.storage.events.read(execution_id)]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED]
    assert isinstance(result, list)
    return result


async def test_durations_too_long_to_keep_are_refused_naming_the_limit(app: Loom) -> None:
    refused = await _run_refusals(
        app,
        [
            lambda ctx: ctx.sleep(1e12),
            lambda ctx: ctx.sleep(timedelta.max),
            lambda ctx: ctx.sleep(10**400),
            lambda ctx: ctx.receive("t", timeout=1e12),
            lambda ctx: ctx.receive("t", timeout=timedelta(days=10**6)),
        ],
        "too-long",
    )
    assert [kind for kind, _ in refused] == ["InvalidDurationError"] * 5
    for _, message in refused:
        assert "at most 31557600000 seconds" in message
        assert "1000 years" in message


@pytest.mark.parametrize("bound", [-1, math.nan, math.inf, 1e12, timedelta(seconds=-1)])
async def test_a_callers_wait_of_no_duration_it_can_keep_is_refused_as_a_duration(
    app: Loom, bound: float | timedelta
) -> None:
    """handle.result() and app.get_event() take their timeout= as the body's waits do:
    refused with InvalidDurationError, as docs/runtime.md's table of errors says."""

    @app.workflow(name="waited")
    async def waited(ctx: Context) -> None:
        await ctx.receive("never")

    handle = await app.start(waited, id="waited")
    with pytest.raises(InvalidDurationError, match="timeout= must be a number of seconds"):
        await handle.result(timeout=bound)
    with pytest.raises(InvalidDurationError, match="timeout= must be a number of seconds"):
        await app.get_event("waited", "k", timeout=bound)


async def test_a_deadline_after_the_latest_one_kept_is_refused(app: Loom) -> None:
    minus_one = timezone(timedelta(hours=-1))
    refused = await _run_refusals(
        app,
        [
            lambda ctx: ctx.sleep_until(datetime.max.replace(tzinfo=UTC)),
            lambda ctx: ctx.sleep_until(datetime.max.replace(tzinfo=minus_one)),
            lambda ctx: ctx.sleep_until(LATEST_DEADLINE + timedelta(microseconds=1)),
        ],
        "too-late",
    )
    assert [kind for kind, _ in refused] == ["InvalidDurationError"] * 3
    assert all("9999-01-01T00:00:00+00:00" in message for _, message in refused)


async def test_a_deadline_before_the_first_instant_in_utc_is_due_at_once(app: Loom) -> None:
    plus_one = timezone(timedelta(hours=1))

    @app.workflow()
    async def long_ago(ctx: Context) -> str:
        await ctx.sleep_until(datetime.min.replace(tzinfo=plus_one))
        await ctx.sleep_until(datetime.min.replace(tzinfo=UTC))
        return "woke"

    handle = await app.start(long_ago, id="long-ago")
    assert await handle.result(timeout=5) == "woke"
    assert await check_replay(app, ["long-ago"]) == ["long-ago"]


async def test_a_wait_that_would_end_after_the_latest_deadline_is_refused() -> None:
    clock = VirtualClock(start=LATEST_DEADLINE - timedelta(days=1))
    app = Loom("memory://", node="n", clock=clock, random=random.Random(7))
    async with app:
        refused = await _run_refusals(
            app,
            [
                lambda ctx: ctx.sleep(timedelta(days=2)),
                lambda ctx: ctx.receive("t", timeout=2 * 86400),
                lambda ctx: ctx.sleep(timedelta(hours=1)),
            ],
            "near-the-end",
        )
    assert [kind for kind, _ in refused[:2]] == ["InvalidDurationError"] * 2
    assert all("would end after 9999-01-01" in message for _, message in refused[:2])
    assert refused[2][0] == "accepted"


def test_retry_delays_stop_at_max_interval_however_many_failures() -> None:
    retry = Retry(attempts=10**6, max_interval=60.0)
    assert [retry.delay(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert retry.delay(1025) == 60.0
    assert retry.delay(10**400) == 60.0
    tiny = Retry(initial_interval=5e-324, backoff=2, max_interval=60.0)
    assert tiny.delay(1200) == 60.0
    assert tiny.delay(1078) == pytest.approx(8.0)  # 2**1077 alone is past a float
    with pytest.raises(InvalidInputError, match="int >= 1"):
        retry.delay(0)


def test_retry_without_max_interval_caps_at_a_hundred_first_waits() -> None:
    """As Temporal's default: a policy of hour-long waits is not cut to a minute, and the
    default policy grows to 100 s."""
    assert Retry(attempts=20).cap == 100.0
    assert [Retry(attempts=20).delay(n) for n in (1, 7, 8, 10**400)] == [1.0, 64.0, 100.0, 100.0]
    hourly = Retry(initial_interval=3600, attempts=10)
    assert [hourly.delay(n) for n in (1, 2, 3)] == [3600.0, 7200.0, 14400.0]
    assert hourly.delay(10**6) == 360000.0
    assert Retry(initial_interval=0).delay(5) == 0.0
    ages = Retry(initial_interval=MAX_DURATION.total_seconds())  # the cap stays in range
    assert ages.cap == ages.delay(3) == MAX_DURATION.total_seconds()
    assert Retry(initial_interval=60, max_interval=30).delay(1) == 30.0  # given: it rules


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"retry_on": "ValueError"}, "retry_on"),
        ({"retry_on": [ValueError]}, "retry_on"),
        ({"retry_on": (ValueError, 3)}, "retry_on"),
        ({"non_retryable": (int,)}, "non_retryable"),
        ({"non_retryable": ValueError()}, "non_retryable"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.0}, "attempts"),
        ({"initial_interval": float("nan")}, "initial_interval"),
        pytest.param({"initial_interval": 10**400}, "initial_interval", id="10**400"),
        ({"max_interval": 1e12}, "max_interval"),
        ({"max_interval": -1}, "max_interval"),
        ({"backoff": 0.5}, "backoff"),
        ({"backoff": float("inf")}, "backoff"),
        ({"backoff": True}, "backoff"),
    ],
)
def test_a_bad_retry_is_refused_where_it_is_written(options: dict[str, object], named: str) -> None:
    with pytest.raises(InvalidOptionError, match=rf"Retry\({named}="):
        Retry(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        # Temporal's maximum_attempts=0 is "without end"; here it is refused.
        ({"attempts": 0}, "to retry without end, give a large number"),
        # Temporal's intervals are timedeltas; here they are seconds.
        ({"initial_interval": timedelta(seconds=1)}, r"pass timedelta\.total_seconds\(\)"),
        ({"max_interval": timedelta(minutes=1)}, r"pass timedelta\.total_seconds\(\)"),
    ],
)
def test_a_retry_written_as_in_temporal_is_refused_saying_what_to_write(
    options: dict[str, object], says: str
) -> None:
    with pytest.raises(InvalidOptionError, match=says):
        Retry(**options)  # type: ignore[arg-type]


async def test_retry_on_one_class_alone_is_taken_as_a_tuple_of_one(app: Loom) -> None:
    calls: list[str] = []

    def flaky() -> str:
        calls.append("try")
        raise ConnectionError("down")

    policy = Retry(attempts=3, initial_interval=0, retry_on=ConnectionError)  # mypy takes one too
    assert policy.retry_on == (ConnectionError,)

    @app.workflow()
    async def tries(ctx: Context) -> str:
        try:
            await ctx.step(flaky, retry=policy)
        except StepFailedError as exc:
            return f"{exc.attempts} {exc.error_type}"
        return "no failure"

    handle = await app.start(tries, id="tries")
    assert await handle.result(timeout=5) == "3 ConnectionError"
    assert calls == ["try"] * 3


@pytest.mark.parametrize("start", ["2030-01-01", 5, datetime(2030, 1, 1)])
def test_a_virtual_clock_refuses_a_start_that_is_not_an_aware_datetime(start: object) -> None:
    with pytest.raises(InvalidInputError, match="timezone-aware datetime"):
        VirtualClock(start=start)  # type: ignore[arg-type]


def test_a_virtual_clock_refuses_a_start_past_the_latest_deadline() -> None:
    minus_one = timezone(timedelta(hours=-1))
    for start in (
        LATEST_DEADLINE + timedelta(seconds=1),
        datetime.max.replace(tzinfo=minus_one),
        datetime.min.replace(tzinfo=timezone(timedelta(hours=1))),
    ):
        with pytest.raises(InvalidInputError, match="VirtualClock\\(start="):
            VirtualClock(start=start)


@pytest.mark.parametrize(
    "by",
    [
        "5", None, True, float("nan"), float("inf"), 1e12, pytest.param(10**400, id="10**400"),
        -1, timedelta(-1),
    ],
)
async def test_a_virtual_clock_refuses_a_bad_advance_and_does_not_move(
    clock: VirtualClock, by: object
) -> None:
    before = clock.now()
    with pytest.raises(InvalidDurationError, match=r"advance|forward only"):
        await clock.advance(by)  # type: ignore[arg-type]
    assert clock.now() == before


async def test_a_virtual_clock_advances_up_to_the_latest_deadline_and_no_further() -> None:
    clock = VirtualClock(start=LATEST_DEADLINE - timedelta(seconds=10))
    await clock.advance(10)
    assert clock.now() == LATEST_DEADLINE
    with pytest.raises(InvalidDurationError, match="past 9999-01-01"):
        await clock.advance(timedelta(microseconds=1))


@pytest.mark.parametrize("seconds", [1e12, float("inf"), pytest.param(10**400, id="10**400")])
async def test_a_virtual_clock_sleep_past_the_latest_deadline_waits_without_end(
    seconds: float,
) -> None:
    clock = VirtualClock(start=LATEST_DEADLINE - timedelta(days=1))
    sleeper = asyncio.create_task(clock.sleep(seconds))
    await clock.advance(timedelta(days=1))
    assert not sleeper.done()
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper


async def test_crash_at_refuses_what_is_not_an_app(app: Loom) -> None:
    with pytest.raises(InvalidInputError, match="Loom app"):
        crash_at(object(), step="charge")  # type: ignore[arg-type]
    assert app.crash_points == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"step": ""},
        {"step": 3},
        {"position": -1},
        {"position": ()},
        {"position": (0, -1)},
        {"position": True},
        {"position": "0"},
        {"step": "charge", "when": "during"},
        {"step": "park", "when": "after"},
        {"step": "park", "when": "unrecorded"},
        {"step": "continue", "when": "unrecorded"},
        {"step": "charge", "execution_id": ""},
        {"step": "charge", "execution_id": 7},
        {"step": "charge", "times": 0},
        {"step": "charge", "times": 1.5},
        {"step": "park", "position": 1},
        {"step": "continue", "position": (0, 1)},
        {"step": "a\x00b"},
        {"step": "charge", "execution_id": "\ud800"},
    ],
)
async def test_crash_at_refuses_a_point_that_could_never_fire_and_arms_nothing(
    app: Loom, options: dict[str, object]
) -> None:
    with pytest.raises(InvalidInputError):
        crash_at(app, **options)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        CrashAt(**options)  # type: ignore[arg-type]
    assert app.crash_points == []


async def test_check_replay_refuses_a_str_of_ids_and_asks_for_a_list(app: Loom) -> None:
    @app.workflow()
    async def tiny(ctx: Context) -> int:
        return 1

    await (await app.start(tiny, id="ab")).result(timeout=5)
    with pytest.raises(InvalidInputError, match=r"pass \['ab'\]"):
        await check_replay(app, "ab")
    with pytest.raises(InvalidInputError, match="non-empty str ids"):
        await check_replay(app, ["ab", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="list of ids"):
        await check_replay(app, 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="Loom app"):
        await check_replay(object(), ["ab"])  # type: ignore[arg-type]
    assert await check_replay(app, ["ab"]) == ["ab"]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("poll_interval", 0),
        ("poll_interval", math.inf),
        ("poll_interval", math.nan),
        ("poll_interval", "1"),
        ("batch", 0),
        ("batch", 2.5),
        ("batch", True),
        ("max_attempts", 0),
        ("backoff_base", -1),
        ("backoff_base", math.nan),
        ("backoff_cap", 86_401),
        ("backoff_cap", math.inf),
        ("capacity", 0),
        ("redrivers", "not-callables"),
        ("redrivers", [42]),
    ],
)
async def test_a_timer_service_refuses_options_it_cannot_run_with(
    app: Loom, option: str, value: object
) -> None:
    with pytest.raises(InvalidOptionError, match=f"TimerService\\({option}=...\\)"):
        TimerService(app, **{option: value})  # type: ignore[arg-type]


async def test_a_retry_after_the_largest_backoff_stays_inside_the_calendar(app: Loom) -> None:
    """The longest backoff a service may be given, drawn at its ceiling on the last day a
    clock may show, with an attempt count far past where the exponent would overflow a
    float, still gives a time the store can keep."""
    service = TimerService(app, backoff_base=86_400, backoff_cap=86_400, max_attempts=10_000)

    class Top:
        def random(self) -> float:
            return 0.999999

        def getrandbits(self, k: int, /) -> int:
            return 0

    app.random = Top()
    wait = service._jitter(5_000)
    assert timedelta(hours=23) < wait <= timedelta(days=1)
    assert LATEST_DEADLINE + wait < datetime.max.replace(tzinfo=UTC)


async def test_arguments_the_body_cannot_take_are_refused_before_anything_is_written(
    app: Loom,
) -> None:
    @app.workflow(name="two")
    async def two(ctx: Context, a: str, b: str, c: str = "c") -> str:
        if a == "again":
            ctx.continue_as_new("only-one")
        return a + b + c

    @app.workflow(name="any")
    async def any_number(ctx: Context, *rest: str) -> int:
        return len(rest)

    for args, takes in (((), "2 to 3"), (("a",), "2 to 3"), (("a", "b", "c", "d"), "2 to 3")):
        with pytest.raises(InvalidInputError, match=f"takes {takes} arguments after ctx"):
            await app.start(two, *args, id="t")
        with pytest.raises(InvalidInputError, match="nothing was written"):
            await app.execute("two", *args, id="t")
    assert await app.storage.events.list_executions() == ()
    # The id is not used up: the same start with the arguments the body takes goes on.
    assert await app.execute(two, "a", "b", id="t") == "abc"
    assert await app.execute(any_number, "x", "y", "z", id="n") == 3
    # A successor's arguments are checked where continue_as_new is called.
    with pytest.raises(WorkflowFailedError, match="takes 2 to 3 arguments after ctx, not 1"):
        await app.execute(two, "again", "b", id="c")


def test_a_body_no_start_could_call_is_refused_when_registered(app: Loom) -> None:
    async def keyword_only(ctx: Context, *, order: str) -> str:
        return order

    async def no_ctx() -> None:
        pass

    with pytest.raises(InvalidOptionError, match="keyword-only parameter 'order'"):
        app.workflow(name="k")(keyword_only)
    with pytest.raises(InvalidOptionError, match="taking ctx first"):
        app.workflow(name="n")(no_ctx)  # type: ignore[type-var]
    assert sorted(app.workflows) == []


class _NaiveClock:
    def now(self) -> datetime:
        return datetime(2030, 1, 1)  # naive: the mistake under test

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def test_a_clock_that_gives_naive_datetimes_is_refused_when_the_app_is_built() -> None:
    with pytest.raises(InvalidOptionError, match="timezone-aware"):
        Loom("memory://", clock=_NaiveClock())


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"decorators": [1]}, r"decorator names or \(name, options\) pairs.*not 1"),
        ({"decorators": [("tenant",)]}, r"not \('tenant',\)"),
        ({"decorators": [("tenant", 5)]}, r"not \('tenant', 5\)"),
        ({"options": 5}, r"Loom\(options=\.\.\.\) must be a mapping"),
        ({"options": ["pool_size", 4]}, r"Loom\(options=\.\.\.\) must be a mapping"),
    ],
)
def test_decorators_and_options_of_a_wrong_shape_are_refused_when_the_app_is_built(
    options: dict[str, object], match: str
) -> None:
    """Refused by Loom(), not first by ``async with app`` where a deploy finds it."""
    with pytest.raises(InvalidOptionError, match=match):
        Loom("memory://", **options)  # type: ignore[arg-type]


class _BrokenRandom(random.Random):
    def __init__(self, value: object, bits: object) -> None:
        super().__init__(1)
        self._value, self._bits = value, bits

    def random(self) -> float:
        return self._value  # type: ignore[return-value]

    def getrandbits(self, k: int, /) -> int:
        return self._bits  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("value", "bits", "call"),
    [
        (math.nan, 5, "random"),
        ("r", 5, "random"),
        (1.0, 5, "random"),
        (0.5, -1, "getrandbits"),
        (0.5, 1 << 128, "getrandbits"),
        (0.5, "b", "getrandbits"),
    ],
)
async def test_a_random_source_that_draws_what_random_does_not_stops_the_run_recording_nothing(
    value: object, bits: object, call: str
) -> None:
    """A misbuilt ``random=`` is the app's fault, not the execution's: the run stops
    with InvalidOptionError (to on_error and result()), nothing is recorded, and the
    execution stays running for an app with a sound source to carry on."""
    errors: list[BaseException] = []
    app = Loom(
        "memory://", node="n", clock=VirtualClock(), random=_BrokenRandom(value, bits),
        on_error=errors.append, timers=False, recover=False,
    )

    @app.workflow(name="draws")
    async def draws(ctx: Context) -> str:
        return str(ctx.random() if call == "random" else ctx.uuid())

    async with app:
        handle = await app.start(draws, id="d")
        with pytest.raises(InvalidOptionError, match=rf"{call}"):
            await handle.result(timeout=5)
        assert [e.kind for e in await app.storage.events.read("d")] == [
            EventKind.EXECUTION_STARTED
        ]
        assert await handle.status() == "running"
        assert [type(e) for e in errors] == [InvalidOptionError]


async def _takes(ctx: Context, order: str) -> str:
    return order


def test_a_partial_registered_without_a_name_is_refused_asking_for_one(app: Loom) -> None:
    bound = functools.partial(_takes, order="o-1")
    with pytest.raises(InvalidOptionError, match=r"name="):
        app.workflow()(bound)
    assert app.workflow(name="takes")(bound) is bound


async def test_a_durable_call_awaited_twice_is_refused_with_what_to_do(app: Loom) -> None:
    async def one() -> int:
        return 1

    @app.workflow(name="twice")
    async def twice(ctx: Context) -> list[str]:
        refused: list[str] = []
        call = ctx.step(one)
        assert await call == 1
        try:
            await call
        except InvalidInputError as exc:
            refused.append(str(exc))
        again = ctx.step(one)
        try:
            await ctx.gather(again, again)
        except InvalidInputError as exc:
            refused.append(str(exc))
        return refused

    said = await (await app.start(twice, id="t")).result(timeout=5)
    assert len(said) == 2
    assert all("awaited once" in words for words in said)
    assert await check_replay(app) == ["t"]


async def test_a_coroutine_given_to_step_is_refused_and_closed(app: Loom) -> None:
    async def one() -> int:
        return 1

    given: list[Coroutine[Any, Any, int]] = []

    @app.workflow(name="coro")
    async def coro(ctx: Context) -> str:
        given.append(one())
        try:
            await ctx.step(given[0])  # type: ignore[call-overload]
        except InvalidInputError as exc:
            return str(exc)
        return "accepted"

    said = await (await app.start(coro, id="c")).result(timeout=5)
    assert "not a coroutine" in said
    # Closed, so no "coroutine ... was never awaited" when it is collected.
    assert inspect.getcoroutinestate(given[0]) == inspect.CORO_CLOSED


@pytest.mark.parametrize("app", [None, 1, "memory://"])
def test_a_timer_service_of_no_app_is_refused(app: object) -> None:
    with pytest.raises(InvalidOptionError, match=r"serves a loom_runtime\.Loom"):
        TimerService(app)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", 42, b"order-1"])
async def test_an_empty_or_non_str_id_is_the_stores_invalid_execution_id_error(
    app: Loom, bad: object
) -> None:
    """The same id is refused with one error class by the app as by the store, so an
    ``except InvalidExecutionIdError`` catches it whichever one the caller used."""

    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: app.start(quick, id=bad),  # type: ignore[call-overload, call-arg]
        lambda: app.execute(quick, id=bad),  # type: ignore[call-overload, call-arg]
        lambda: app.send(bad, "topic", 1),  # type: ignore[arg-type]
        lambda: app.cancel(bad),  # type: ignore[arg-type]
        lambda: app.get(bad).status(),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidExecutionIdError) as refused:
            await call()
        assert refused.value.value == bad
    with pytest.raises(InvalidExecutionIdError):
        await app.storage.events.head(bad)  # type: ignore[arg-type]
    assert [v async for v in app.executions()] == []


class _Forwarding:
    """Forwards every attribute to another object, as a proxy does: it defines none of the
    methods on its class."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_clock_and_a_random_source_that_forward_their_methods_are_accepted() -> None:
    # Python 3.12 and 3.13 refused both ("Loom(clock=...) must have now() and sleep()"),
    # 3.11 did not.
    clock = VirtualClock()
    forwarding = _Forwarding(clock)
    drawn = _Forwarding(random.Random(7))
    app = Loom("memory://", node="n", clock=forwarding, random=drawn)
    async with app:

        @app.workflow()
        async def napping(ctx: Context) -> str:
            await ctx.sleep(timedelta(seconds=5))
            return "woke"

        handle = await app.start(napping, id="nap")
        await clock.advance(5)
        assert await handle.result(timeout=5) == "woke"


@pytest.mark.parametrize("argument", ["clock", "random"])
def test_a_clock_or_random_source_lacking_its_methods_is_refused(argument: str) -> None:
    with pytest.raises(InvalidOptionError, match=rf"Loom\({argument}=\.\.\.\) must have"):
        Loom("memory://", node="n", **{argument: object()})  # type: ignore[arg-type]
