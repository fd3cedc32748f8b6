"""The app's observability hooks, called so that a failing hook never breaks a run.

- ``on_event(execution_id, new_event)`` fires *before* the durable write: after a crash or
  a failed write it may report an event the log never recorded. Never page, bill or audit
  from it.
- ``on_durable_event(event)`` fires after the write: what it reports is in the log. It is
  at most once: a process that dies just after a write never delivers that event. A write
  whose reply was lost is reported once a take-back finds it in the log, so the order may
  differ from the log's.
- ``on_storage_error(execution_id, error)``: a store call failed under a run. With none
  given, it is logged at WARNING: the first of a run of such failures, and one of another
  type of error; the others at DEBUG, and once at INFO when a run's write goes through
  again (an outage stops every run at once, and fails each carry-on try).
- ``on_error(error)``: a failure with no caller to raise to (a diverged replay in the
  background, an exhausted re-drive, a failing poll).

``on_event`` and ``on_durable_event`` are handed their own copy of the event: a hook that
changes its payload in place must change neither what is written nor what the run keeps.

A hook that raises is logged, whatever it raises but KeyboardInterrupt and SystemExit:
each bug (a hook, the type of what it raised, the line it raised from) with its traceback
the first time, then at DEBUG, with a line counting its repeats at the 10th, 100th,
1000th...: a hook that fails at every event is seen, without a traceback per event.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final, final

from loom_core import Event, InvalidOptionError, JsonValue, NewEvent
from loom_runtime.records import fresh

__all__ = ["Hooks"]

_log = logging.getLogger("loom_runtime")

OnEvent = Callable[[str, NewEvent], object]
OnDurableEvent = Callable[[Event], object]
OnStorageError = Callable[[str, BaseException], object]
OnError = Callable[[BaseException], object]

_BUGS_REMEMBERED: Final = 256
"""How many hook bugs the counts are kept for; the oldest is forgotten first (and logged
with its traceback again if it comes back)."""

_Bug = tuple[str, type[BaseException] | None, str, int]
"""A hook's name, what it raised (None: it returned a coroutine), and the file and line
it raised from."""


@final
class Hooks:
    __slots__ = (
        "_bugs",
        "_storage_failing",
        "_storage_failures",
        "on_durable_event",
        "on_error",
        "on_event",
        "on_storage_error",
    )

    def __init__(
        self,
        *,
        on_event: OnEvent | None = None,
        on_durable_event: OnDurableEvent | None = None,
        on_storage_error: OnStorageError | None = None,
        on_error: OnError | None = None,
    ) -> None:
        for name, hook in (
            ("on_event", on_event),
            ("on_durable_event", on_durable_event),
            ("on_storage_error", on_storage_error),
            ("on_error", on_error),
        ):
            if hook is not None and not callable(hook):
                raise InvalidOptionError(f"Loom({name}=...) must be callable, not {hook!r}")
            if hook is not None and (
                inspect.iscoroutinefunction(hook)
                or inspect.iscoroutinefunction(type(hook).__call__)
            ):
                raise InvalidOptionError(
                    f"Loom({name}=...) must be a plain function, not a coroutine function: "
                    "hooks are called on the event loop and not awaited; to do async work "
                    "from one, start it with asyncio.get_running_loop().create_task(...)"
                )
        self.on_event = on_event
        self.on_durable_event = on_durable_event
        self.on_storage_error = on_storage_error
        self.on_error = on_error
        # How often each hook bug was met (see the module docstring).
        self._bugs: OrderedDict[_Bug, int] = OrderedDict()
        # With no on_storage_error: the type of store failure last logged at WARNING, and
        # how many failed since the store last answered (see storage_error).
        self._storage_failing: type[BaseException] | None = None
        self._storage_failures = 0

    def event(self, execution_id: str, event: NewEvent) -> None:
        if self.on_event is not None:
            own = NewEvent(event.kind, fresh(event.payload), _fresh_metadata(event.metadata))
            self._call("on_event", self.on_event, execution_id, own)

    def durable_event(self, event: Event) -> None:
        if self.on_durable_event is not None:
            own = dataclasses.replace(
                event, payload=fresh(event.payload), metadata=_fresh_metadata(event.metadata)
            )
            self._call("on_durable_event", self.on_durable_event, own)

    def storage_error(self, execution_id: str, error: BaseException) -> None:
        if self.on_storage_error is not None:
            self._call("on_storage_error", self.on_storage_error, execution_id, error)
            return
        self._storage_failures += 1
        about = {"execution_id": execution_id}
        if type(error) is not self._storage_failing:
            self._storage_failing = type(error)
            _log.warning(
                "a store call failed under %s, which stops until the store answers and the "
                "app carries it on: %s (more such failures are logged at DEBUG until then)",
                execution_id, error, extra=about,
            )
        else:
            _log.debug("a store call failed again under %s: %s", execution_id, error,
                       extra=about)

    @property
    def store_failing(self) -> bool:
        """Whether store failures under runs were logged for want of ``on_storage_error``
        since a run's write last went through."""
        return self._storage_failures != 0

    def store_answered(self) -> None:
        """A run's write went through: the failures logged for want of
        ``on_storage_error`` are over. Not a take-back's: a store that takes the
        take-back's small write and fails the run's next one is one outage still."""
        if self._storage_failures and self.on_storage_error is None:
            _log.info(
                "the store answers again: a run's write went through, after %d store "
                "calls failed under runs", self._storage_failures,
            )
        self._storage_failing = None
        self._storage_failures = 0

    def app_left(self) -> None:
        """The app was left: the runs a store failure stopped are its next entry's to
        carry on, and that entry's first store failure is logged at WARNING again."""
        self._storage_failing = None
        self._storage_failures = 0

    def error(self, error: BaseException) -> None:
        if self.on_error is None:
            execution_id = getattr(error, "execution_id", None)
            about = {"execution_id": execution_id} if isinstance(execution_id, str) else {}
            _log.error("%s", error, exc_info=error, extra=about)
            return
        self._call("on_error", self.on_error, error)

    def _call(self, name: str, hook: Callable[..., object], *args: object) -> None:
        try:
            result = hook(*args)
        except (KeyboardInterrupt, SystemExit):
            raise  # they end the process, from a hook as from anywhere
        except BaseException as exc:
            # A hook is no part of a run: whatever else it raises (a BaseException of its
            # own too) must not stop the run, nor be reported as the body's.
            self._raised(name, exc)
            return
        if result is not None and inspect.iscoroutine(result):
            result.close()  # never awaited: say so, rather than Python's bare warning
            count = self._met((name, None, "", 0))
            if count == 1:
                _log.error("the %s hook returned a coroutine, which is not awaited", name)
            elif _tenfold(count):
                _log.error(
                    "the %s hook returned a coroutine again, which is not awaited: %d times "
                    "so far", name, count,
                )

    def _raised(self, name: str, exc: BaseException) -> None:
        """Log what a hook raised: with its traceback the first time this bug is met, then
        at DEBUG, counted at ERROR at the 10th, 100th, 1000th... time."""
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        filename, line = ("", 0) if where is None else (
            where.tb_frame.f_code.co_filename, where.tb_lineno
        )
        count = self._met((name, type(exc), filename, line))
        if count == 1:
            _log.error("the %s hook raised; the run goes on", name, exc_info=exc)
        elif _tenfold(count):
            _log.error(
                "the %s hook raised %s at %s:%d again: %d times so far (after the first, "
                "logged at DEBUG); the run goes on",
                name, type(exc).__name__, os.path.basename(filename), line, count,
            )
        else:
            # No traceback: it raised from the same line as the one logged.
            _log.debug("the %s hook raised again: %r", name, exc)

    def _met(self, bug: _Bug) -> int:
        """How many times ``bug`` was met, this one included."""
        count = self._bugs.pop(bug, 0) + 1
        self._bugs[bug] = count
        while len(self._bugs) > _BUGS_REMEMBERED:
            self._bugs.popitem(last=False)
        return count


def _tenfold(count: int) -> bool:
    """Whether ``count`` is 10, 100, 1000...: when a repeated hook bug is counted."""
    return count >= 10 and str(count).rstrip("0") == "1"


def _fresh_metadata(metadata: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    return {k: fresh(v) for k, v in metadata.items()}
