"""How often a step is tried: :class:`Retry`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from loom_core import InvalidInputError, InvalidOptionError
from loom_runtime.clock import MAX_DURATION, shown

__all__ = ["Retry"]

_MAX_SECONDS = MAX_DURATION.total_seconds()


@dataclass(frozen=True, slots=True)
class Retry:
    """Try a step up to ``attempts`` times, waiting ``initial_interval * backoff**(n-1)``
    seconds (at most ``max_interval``; without one, at most a hundred times
    ``initial_interval``, Temporal's default) after the n-th failure.

    Only exceptions that are instances of ``retry_on`` and not of ``non_retryable`` are
    retried; the last failure is recorded as STEP_FAILED, each one before it as
    STEP_ATTEMPT_FAILED with the instant of the next try, so a run that dies while it
    waits goes on from the next attempt, at that instant (an attempt in flight when its
    process dies is made again: steps are at least once).

    Every field is checked here, so a bad policy is refused where it is written, not at a
    step's first failure: ``attempts`` an int >= 1; the intervals numbers of seconds from 0
    to ``MAX_DURATION`` (1000 years), ``max_interval`` None too; ``backoff`` a finite
    number >= 1; ``retry_on`` and ``non_retryable`` exception classes, in a tuple (a class
    alone is kept as a tuple of one, as ``isinstance`` takes it).
    """

    attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float | None = None
    # One class alone is taken, and kept as a tuple of one.
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,)
    non_retryable: type[BaseException] | tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise InvalidOptionError(f"Retry(attempts=...) must be an int, not {self.attempts!r}")
        if self.attempts < 1:
            raise InvalidOptionError(
                f"Retry(attempts={shown(self.attempts)}) must be at least 1 (1: no retry); "
                "to retry without end, give a large number (0 is no 'unlimited' here)"
            )
        for name in ("initial_interval", "max_interval"):
            value = getattr(self, name)
            if value is None and name == "max_interval":
                continue
            if not _is_number(value) or not 0 <= value <= _MAX_SECONDS:
                hint = "; pass timedelta.total_seconds()" if isinstance(value, timedelta) else ""
                raise InvalidOptionError(
                    f"Retry({name}=...) must be a number of seconds from 0 to "
                    f"{_MAX_SECONDS:.0f} (1000 years), not {shown(value)}{hint}"
                )
        if not _is_number(self.backoff) or not 1 <= self.backoff < math.inf:
            raise InvalidOptionError(
                f"Retry(backoff=...) must be a finite number >= 1 (1: the same wait each "
                f"time), not {shown(self.backoff)}"
            )
        for name in ("retry_on", "non_retryable"):
            object.__setattr__(self, name, _exception_classes(name, getattr(self, name)))

    @property
    def cap(self) -> float:
        """The longest wait: ``max_interval``, or a hundred times ``initial_interval``
        (at most ``MAX_DURATION``) when it was not given."""
        if self.max_interval is not None:
            return float(self.max_interval)
        return min(100.0 * self.initial_interval, _MAX_SECONDS)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure (1 for the first).

        Never overflows: once ``initial_interval * backoff**(failures-1)`` would pass
        :attr:`cap`, the answer is the cap without the power being computed.
        """
        if not isinstance(failures, int) or isinstance(failures, bool) or failures < 1:
            raise InvalidInputError(
                f"Retry.delay takes the number of failures so far, an int >= 1, not "
                f"{shown(failures)}"
            )
        first, cap = float(self.initial_interval), self.cap
        if first == 0 or first >= cap or self.backoff == 1:
            return min(first, cap)
        steps = failures - 1
        # first * backoff**steps passes cap once steps > log(cap / first) / log(backoff),
        # compared as numbers (an int of any size against a float), never as a power.
        if steps > (math.log(cap) - math.log(first)) / math.log(self.backoff):
            return cap
        try:
            return min(cap, first * self.backoff**steps)
        except OverflowError:
            # The power alone overflows though the product does not (a tiny first wait):
            # the same product in logarithms, which stay below log(cap).
            return min(cap, math.exp(math.log(first) + steps * math.log(self.backoff)))

    def retries(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.non_retryable)


def _is_number(value: object) -> bool:
    """An int or a float that is not NaN (a bool is refused, though it is an int)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _exception_classes(name: str, value: object) -> tuple[type[BaseException], ...]:
    classes = (value,) if isinstance(value, type) else value
    if not isinstance(classes, tuple) or not all(
        isinstance(c, type) and issubclass(c, BaseException) for c in classes
    ):
        raise InvalidOptionError(
            f"Retry({name}=...) takes exception classes, in a tuple or one alone (e.g. "
            f"(TimeoutError, ConnectionError)), not {value!r}"
        )
    return classes


NO_RETRY = Retry(attempts=1, initial_interval=0.0)
