"""How often a step is tried: :class:`Retry`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loom_core import InvalidOptionError

__all__ = ["Retry"]


@dataclass(frozen=True, slots=True)
class Retry:
    """Try a step up to ``attempts`` times, waiting ``initial_interval * backoff**(n-1)``
    seconds (at most ``max_interval``) after the n-th failure.

    Only exceptions that are instances of ``retry_on`` and not of ``non_retryable`` are
    retried; the last failure is recorded as STEP_FAILED. The waits between attempts are
    not durable: a process that dies while waiting tries the step again from attempt 1
    (steps are at least once).
    """

    attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise InvalidOptionError(f"Retry(attempts=...) must be an int, not {self.attempts!r}")
        if self.attempts < 1:
            raise InvalidOptionError(f"Retry(attempts={self.attempts}) must be at least 1")
        for name in ("initial_interval", "backoff", "max_interval"):
            value = getattr(self, name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidOptionError(
                    f"Retry({name}=...) must be a finite number >= 0, not {value!r}"
                )
        if self.backoff < 1:
            raise InvalidOptionError(f"Retry(backoff={self.backoff}) must be at least 1")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure."""
        return min(self.max_interval, self.initial_interval * self.backoff ** (failures - 1))

    def retries(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.non_retryable)


NO_RETRY = Retry(attempts=1, initial_interval=0.0)
