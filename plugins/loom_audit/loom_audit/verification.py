"""Walking a chain: every link checked in order, the first broken one reported.

What a walk detects **without** an exported head, for events still in the log: a changed
byte anywhere in an event's kind, payload, metadata (fence stamp included) or link; two
events swapped; an event removed from the middle (a gap, or everything after it shifted
down); an event inserted; an event copied in from another execution or another position;
a log whose head counter says it had more events than it now holds (when the store keeps
that counter apart from the rows, as the memory store does); a log whose first events are
gone (reported unless the caller says the log was compacted); and a row the store's head
does not cover (at or past ``head()``, e.g. inserted without moving the head), which a
store that returns it from ``read`` would hand out unverified. The last link of an intact
chain is exactly at ``head() - 1``.

What decides behaviour is covered: the hash covers every event's kind and metadata, and so
every input of the answering classification (the kind, ``metadata["kernel"]``) and the
fence stamp. The walk reads nothing a store derives from them: a backend's own copy of the
classification (SQLite's ``answering`` column) is not part of the log, so a flipped
derived column is not a broken chain; it is the store's to derive from the covered fields
when it decides, not to trust as stored.

What it does **not** detect without a head: events removed from the end of the log when the
store's head counter went with them; the whole log deleted; and any rewrite by someone who
recomputes every hash from the changed event on (the hash is public, so the chain alone
only proves internal consistency). An exported head (:class:`~loom_audit.ChainHead`) closes
all three up to its sequence; events appended after the head are covered by the next head
you export. Neither covers ``recorded_at`` (the store's clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from loom_audit.chain import GENESIS, link_hash, read_link
from loom_audit.heads import ChainHead
from loom_core import Event
from loom_core.errors import InvalidInputError

__all__ = ["BreakReason", "ChainBroken", "ChainIntact", "ChainWalk", "Verification"]

BreakReason: TypeAlias = Literal[
    "missing_link",      # the event carries no (well-formed) chain link
    "genesis",           # sequence 0 does not start from GENESIS
    "truncated_prefix",  # the log does not start at 0 and the caller did not allow that
    "sequence",          # a gap, a repeat or a reordering of sequences
    "link",              # prev is not the predecessor's hash
    "content",           # the event is not what its hash says
    "tail",              # the store's head counter is past the last event
    "beyond_head",       # an event at or past the store's head counter: not in the log
    "head_signature",    # the exported head's signature does not verify
    "head_not_covered",  # the head's event was truncated away: it cannot be checked
    "head_truncated",    # the log ends before the exported head: its tail was removed
    "head_mismatch",     # the event at the head's sequence is not the exported one
    "unreadable",        # a layer below refused to read an event (e.g. shredded)
]


@dataclass(frozen=True, slots=True)
class ChainIntact:
    """Every link holds. ``first_sequence`` is where the retained log starts (0 unless it
    was compacted: then ``anchored_at_genesis`` is false and the first kept event's
    ``prev`` was taken on trust); ``head_checked`` says whether an exported head was
    compared too."""

    execution_id: str
    events: int
    first_sequence: int | None
    last_sequence: int | None
    anchored_at_genesis: bool
    head_checked: bool
    ok: Literal[True] = True


@dataclass(frozen=True, slots=True)
class ChainBroken:
    """The first broken link: at ``sequence``, for ``reason``, explained in ``detail``."""

    execution_id: str
    sequence: int
    reason: BreakReason
    detail: str
    ok: Literal[False] = False


Verification: TypeAlias = ChainIntact | ChainBroken


class ChainWalk:
    """Feed events in order with :meth:`step`; :meth:`finish` checks the end and the head.

    ``store_head`` is the store's ``head()`` taken *before* the events were read (events
    appended after it are not part of this walk); ``head`` an exported head to check.
    """

    __slots__ = (
        "_allow_truncated", "_at_head", "_broken", "_count", "_first", "_head", "_head_key",
        "_next", "_prev", "execution_id",
    )

    def __init__(
        self,
        execution_id: str,
        *,
        head: ChainHead | None = None,
        head_key: bytes | None = None,
        allow_truncated_prefix: bool = False,
    ) -> None:
        if head is not None and head.execution_id != execution_id:
            raise InvalidInputError(
                f"the head was exported for {head.execution_id!r}, not {execution_id!r}"
            )
        self.execution_id = execution_id
        self._head = head
        self._head_key = head_key
        self._allow_truncated = allow_truncated_prefix
        self._prev: str | None = None
        self._next: int | None = None
        self._first: int | None = None
        self._count = 0
        self._at_head: str | None = None
        self._broken: ChainBroken | None = None

    @property
    def broken(self) -> ChainBroken | None:
        return self._broken

    def fail(self, sequence: int, reason: BreakReason, detail: str) -> ChainBroken:
        """End the walk with a break found outside it (e.g. an unreadable event)."""
        return self._break(sequence, reason, detail)

    def _break(self, sequence: int, reason: BreakReason, detail: str) -> ChainBroken:
        self._broken = ChainBroken(self.execution_id, sequence, reason, detail)
        return self._broken

    def step(self, event: Event) -> ChainBroken | None:
        """Check one event; returns the break (and ignores later events) once there is one."""
        if self._broken is not None:
            return self._broken
        sequence = event.sequence
        link = read_link(event.metadata)
        if link is None:
            return self._break(sequence, "missing_link", "the event carries no chain link")
        if self._next is None:
            self._first = sequence
            if sequence == 0:
                if link.prev != GENESIS:
                    return self._break(0, "genesis", "sequence 0 does not start from GENESIS")
            elif not self._allow_truncated:
                return self._break(
                    sequence, "truncated_prefix",
                    f"the log starts at sequence {sequence}: the events before it are gone "
                    "(compacted or deleted); pass allow_truncated_prefix=True for a log you "
                    "compacted with truncate_prefix_keeping",
                )
        else:
            if sequence != self._next:
                return self._break(
                    sequence, "sequence", f"expected sequence {self._next}, found {sequence}"
                )
            if link.prev != self._prev:
                return self._break(
                    sequence, "link", f"prev does not match the hash of event {sequence - 1}"
                )
        own = link_hash(
            self.execution_id, sequence, event.kind, event.payload, event.metadata, link.prev
        )
        if own != link.hash:
            return self._break(
                sequence, "content", "the event's kind, payload or metadata is not what its "
                "link hash covers"
            )
        if self._head is not None and sequence == self._head.sequence:
            self._at_head = own
        self._prev, self._next = own, sequence + 1
        self._count += 1
        return None

    def finish(self, store_head: int | None) -> Verification:
        """The verdict, once every event up to ``store_head - 1`` was fed."""
        if self._broken is not None:
            return self._broken
        last = None if self._next is None else self._next - 1
        emptied = self._next is None and bool(store_head)
        if emptied and not self._allow_truncated:
            return self._break(
                0, "truncated_prefix",
                f"the store's head is {store_head} but no event is left: all were compacted "
                "or deleted; pass allow_truncated_prefix=True for a log you compacted",
            )
        if store_head is not None and self._next is not None and self._next > store_head:
            return self._break(
                store_head, "beyond_head",
                f"the store's head is {store_head} but the log holds an event at sequence "
                f"{last}: a row the head does not cover (inserted without moving the head, "
                "or the head moved back)",
            )
        if store_head is not None and self._next is not None and store_head != self._next:
            return self._break(
                self._next, "tail",
                f"the store's head is {store_head} but the log ends at sequence {last}: "
                "events were removed from its end",
            )
        head = self._head
        if head is not None:
            if self._head_key is not None and not head.signature_matches(self._head_key):
                return self._break(
                    head.sequence, "head_signature",
                    "the head's signature does not verify under this decorator's head_key",
                )
            if last is None or head.sequence > last:
                return self._break(
                    head.sequence, "head_truncated",
                    f"the head was exported at sequence {head.sequence} but the log ends "
                    f"at {last if last is not None else '(no events)'}: its tail was removed",
                )
            if self._first is not None and head.sequence < self._first:
                return self._break(
                    head.sequence, "head_not_covered",
                    f"the head's event ({head.sequence}) was truncated away (the log starts "
                    f"at {self._first}); verify against a head exported after compaction",
                )
            if self._at_head != head.hash:
                return self._break(
                    head.sequence, "head_mismatch",
                    f"event {head.sequence} is not the one the head was exported for: the "
                    "log was rewritten up to it",
                )
        return ChainIntact(
            self.execution_id,
            events=self._count,
            first_sequence=self._first,
            last_sequence=last,
            anchored_at_genesis=self._first == 0 or (self._first is None and not emptied),
            head_checked=head is not None,
        )
