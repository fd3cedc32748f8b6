"""The :class:`Storage` bundle: one event store, timer store and lease store, opened and
closed together."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import final

from typing_extensions import get_protocol_members

from loom_core.errors import InvalidOptionError
from loom_core.protocols import EventStore, LeaseStore, TimerStore

__all__ = ["Storage"]


@final
class Storage:
    """Stores that share one backend. Use as ``async with`` or call :meth:`close`.

    ``on_close`` runs after the three stores are closed (a backend closes its pool or
    connection there). Closing twice is harmless.
    """

    __slots__ = ("_closed", "_on_close", "events", "leases", "timers", "url")

    def __init__(
        self,
        events: EventStore,
        timers: TimerStore,
        leases: LeaseStore,
        *,
        url: str = "",
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        for name, value, protocol in (
            ("events", events, EventStore),
            ("timers", timers, TimerStore),
            ("leases", leases, LeaseStore),
        ):
            # hasattr, not isinstance: from Python 3.12 on, isinstance() of a protocol
            # looks attributes up statically, and so refuses a store that forwards what it
            # does not define itself through __getattr__ (a proxy, a test double), which
            # it accepted before; hasattr accepts it on every version.
            lacking = sorted(m for m in get_protocol_members(protocol) if not hasattr(value, m))
            if lacking:
                raise InvalidOptionError(
                    f"Storage({name}=...) must implement {protocol.__name__}; "
                    f"{type(value).__name__} lacks {', '.join(lacking)}"
                    + (
                        " (optional methods it does not offer must still exist and raise "
                        "Unsupported: inherit loom_core.spi.RefusesUnoffered)"
                        if protocol is EventStore
                        else ""
                    )
                )
        self.events = events
        self.timers = timers
        self.leases = leases
        self.url = url
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Every store is closed even when an earlier one fails, then the first failure is
        # raised: a failing event store must not leave the pool behind it open.
        failures: list[BaseException] = []
        closers: list[Callable[[], Awaitable[None]]] = [
            self.events.close, self.timers.close, self.leases.close
        ]
        if self._on_close is not None:
            closers.append(self._on_close)
        for close in closers:
            try:
                await close()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    async def __aenter__(self) -> Storage:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Storage({self.url or type(self.events).__name__})"
