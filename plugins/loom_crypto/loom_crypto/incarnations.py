"""The log incarnations one decorator remembers from its own fenced appends, so the next
fenced append under the same token needs no read of the log's first event.

An entry is what a fenced append that landed left: the incarnation it continued (or
started) and the token the store accepted it under (the ``fence`` of ``append``, the
``observed_fence`` of ``append_if_unchanged``). It is used only for an append the inner
store accepts only under exactly that token, and such an append lands only in the log the
entry was taken from, because

- the store refuses it unless the execution's token is still that one;
- the incarnation of a log changes only when the log is deleted and its id written again;
- and a delete moves the token one past its current value (docs/design.md, "Deleting a log
  fences out its writers"), while no token ever moves back.

So when such an append lands, nobody deleted the log since the entry's append landed, by
this process or any other, and the log's incarnation is the remembered one. When it does
not land, the store refused it and nothing was written. Unlike the audit chain's tips, the
sequence does not matter: every event of one log carries the same incarnation.

An unfenced append presents no token, so the decorator makes it ``append_if_unchanged``
under the remembered token (which checks the token, and stamps and bumps nothing: the same
write otherwise); refused, it forgets the entry and appends as asked, after reading the
first event. A log this decorator created unfenced is remembered under token 0, a guess:
the token of an id never fenced nor deleted. The guess is safe for the same reason (a
token still 0 has never moved, so the log was never deleted), and a wrong one costs one
refused write, once.

The map is bounded: past ``size`` executions the one recorded least recently is dropped,
and its next append reads the log's first event as if never remembered.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, final

__all__ = ["DEFAULT_INCARNATION_CACHE_SIZE", "Incarnations"]

DEFAULT_INCARNATION_CACHE_SIZE: Final = 4096


@final
class Incarnations:
    """execution id → (incarnation, token), at most ``size`` of them (0 remembers none)."""

    __slots__ = ("_known", "_size")

    def __init__(self, size: int = DEFAULT_INCARNATION_CACHE_SIZE) -> None:
        self._size = size
        self._known: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def under(self, execution_id: str, fence: int) -> str | None:
        """The incarnation an append under ``fence`` continues, when a fenced append under
        that very token landed before; None: read it from the log."""
        known = self._known.get(execution_id)
        if known is None or known[1] != fence:
            return None
        return known[0]

    def record(self, execution_id: str, incarnation: str, fence: int) -> None:
        """Remember that an append under ``fence`` landed in ``incarnation``, unless an
        append under a newer token is already remembered (both are true; the newer one is
        the one later appends present)."""
        if self._size == 0:
            return
        known = self._known.get(execution_id)
        if known is not None and known[1] > fence:
            return
        self._known[execution_id] = (incarnation, fence)
        self._known.move_to_end(execution_id)
        if len(self._known) > self._size:
            self._known.popitem(last=False)

    def known(self, execution_id: str) -> tuple[str, int] | None:
        """The remembered (incarnation, token), whatever token an append presents."""
        return self._known.get(execution_id)

    def forget_if_still(self, execution_id: str, seen: tuple[str, int]) -> None:
        """Drop ``seen`` after the store refused its token; one recorded since by an
        append that landed meanwhile is kept."""
        if self._known.get(execution_id) is seen:
            del self._known[execution_id]
