"""The chain tips one decorator remembers from its own appends, so a fenced append needs no
read of its predecessor.

A tip is what a successful append left: the next sequence, the link hash of the last
event written, and the fence token the append was accepted under (the ``fence`` of a
fenced append, the ``observed_fence`` of ``append_if_unchanged``; 0 for a log the
decorator created unfenced, a guess). It is only ever used for an append that the inner
store will accept only in exactly that state: at ``expected_sequence == next`` **and**
under that same token (an unfenced append is sent as ``append_if_unchanged`` under it).
Such an append succeeds only if the log is still where the tip left it, because

- the store refuses it unless the head is still ``next`` and the token still that fence;
- a head only moves forward, except through ``delete_execution``;
- and a delete moves the token one past its current value (docs/design.md, "Deleting a log
  fences out its writers"), while no token ever moves back.

So when such an append lands, nobody appended, deleted or re-created the log since the tip
was taken, by this process or any other, and the predecessor is the event whose hash the
tip holds. When it does not land, the store refused it and nothing was written. A tip
recorded late (its append's task resumed after a newer one) is still true whenever it
matches, by the same argument; keeping the newest one only saves reads.

The map is bounded: past ``size`` executions the one recorded least recently is dropped,
and its next append reads its predecessor as if never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, final

__all__ = ["DEFAULT_TIP_CACHE_SIZE", "ChainTips", "Tip"]

DEFAULT_TIP_CACHE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class Tip:
    """Where an execution's chain stood after this decorator's last append to it."""

    next_sequence: int
    hash: str
    fence: int

    def newer_than(self, other: Tip) -> bool:
        # Every store's (token, head) only grows in this order: an append grows the head
        # under the same token, an acquire or a delete grows the token.
        return (self.fence, self.next_sequence) > (other.fence, other.next_sequence)


@final
class ChainTips:
    """execution id → :class:`Tip`, at most ``size`` of them (0 remembers none)."""

    __slots__ = ("_size", "_tips")

    def __init__(self, size: int = DEFAULT_TIP_CACHE_SIZE) -> None:
        self._size = size
        self._tips: OrderedDict[str, Tip] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tips)

    def get(self, execution_id: str) -> Tip | None:
        return self._tips.get(execution_id)

    def record(self, execution_id: str, tip: Tip) -> None:
        """Remember ``tip`` unless a newer one is already remembered."""
        if self._size == 0:
            return
        held = self._tips.get(execution_id)
        if held is not None and held.newer_than(tip):
            return
        self._tips[execution_id] = tip
        self._tips.move_to_end(execution_id)
        while len(self._tips) > self._size:
            self._tips.popitem(last=False)

    def forget(self, execution_id: str) -> None:
        self._tips.pop(execution_id, None)

    def forget_if_still(self, execution_id: str, seen: Tip | None) -> None:
        """Drop the tip an append saw before it failed; one recorded since by an append
        that succeeded meanwhile is kept (it is true whenever it matches)."""
        if seen is not None and self._tips.get(execution_id) is seen:
            del self._tips[execution_id]
