"""The audit-chain decorator: every append is linked to its actual predecessor.

An append at ``expected_sequence`` links the new events after the hash of the event at
``expected_sequence - 1`` and hands the inner store the same ``expected_sequence``. The
inner append is atomic and refuses a moved head, so an append that lands was linked to
the event that really precedes it; one that raced another writer fails with
``SequenceConflictError`` like any append, and the caller retries from the new head. A
second process writing the same store is linked correctly too.

Where the predecessor's hash comes from:

- **A remembered tip, with no read**, for a fenced append (and ``append_if_unchanged``)
  at the sequence and under the token of this decorator's own last successful append to
  that execution (:mod:`loom_audit.tips` says why that is safe: the inner store accepts
  such an append only if nobody appended, deleted or re-created the log since, because a
  delete moves the token). The tips are bounded (``tip_cache_size``, 4,096 executions by
  default, the least recently written dropped first).
- **An unfenced append at the tip's sequence** is sent as ``append_if_unchanged`` under
  the tip's token (the same write: nothing stamped, no token moved), so the store refuses
  it exactly when the tip may be stale; refused, nothing was written, the tip is dropped
  and the append reads its predecessor as below. A log this decorator creates unfenced is
  remembered under token 0, a guess (the token of an id never fenced nor deleted) that is
  safe for the same reason and, when wrong, costs one refused write, once.
- **A read of the predecessor** (one round-trip) for everything else: an unfenced append
  on a store without ``append_if_unchanged``, any mismatch of sequence or token, and an
  execution whose tip was dropped. An append that fails or is interrupted drops the tip it
  saw, and so do ``delete_execution`` and ``truncate_prefix_keeping`` through this
  decorator.

Reads through the decorator (``read``, ``subscribe``, the events ``append`` returns) show
each event as the caller wrote it, without the ``chain`` field, exactly as an undecorated
store would; the links live in the stored rows, where :meth:`AuditEventStore.read_chained`,
:meth:`AuditEventStore.verify` and :meth:`AuditEventStore.export_head` read them.

The optional methods, decided:

- ``acquire_fence``, ``acquire_fence_if``: forwarded; they add nothing to a log (an
  acquire moves only the token, which the next fenced append's stamp records).
- ``subscribe``: forwarded, each event shown without its link (like ``read``).
- ``append_if_unchanged``, ``append_many``: linked like ``append``, then forwarded.
- ``delete_execution``: forwarded, and the execution's tip dropped. The chain goes with the
  log; a re-created id starts a new chain from GENESIS, and a head exported for the old
  log no longer verifies.
- ``truncate_prefix_keeping``: forwarded, and the execution's tip dropped. The first kept
  event's ``prev`` becomes the anchor (the only trace of what was dropped);
  :func:`verify` reports such a log as not anchored at genesis, and refuses it unless
  told it was compacted. If every event is dropped, the next append cannot read its
  predecessor and links from ``prev: null`` (or, in a process that still remembers the
  tip because another one compacted, from the dropped last event's hash; both verify as
  a compacted log). Export a head before compacting if you need to prove what was there.
- ``copy_prefix``: refused. Every link hashes its execution id, so a copied event would
  not verify in the target; branch by reading the prefix and appending it to the target
  through this decorator, which starts the target's own chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Final

from loom_audit.chain import (
    CHAIN_FIELD,
    GENESIS,
    chain_events,
    read_link,
    refuse_chain_field,
    without_chain,
)
from loom_audit.errors import NoHeadError
from loom_audit.heads import ChainHead, sign_head
from loom_audit.tips import DEFAULT_TIP_CACHE_SIZE, ChainTips, Tip
from loom_audit.verification import ChainBroken, ChainWalk, Verification
from loom_core import Event, NewEvent
from loom_core.decorating import (
    FORWARD,
    Decisions,
    EventStoreDecorator,
    Implement,
    Refuse,
    find_layers,
)
from loom_core.errors import (
    ExecutionNotFoundError,
    InvalidOptionError,
    PayloadShreddedError,
    SequenceConflictError,
    StaleFenceError,
)
from loom_core.spi import (
    AppendRequest,
    EventStore,
    build_event,
    check_append,
    check_append_requests,
    check_execution_id,
    check_fence,
)

__all__ = ["AuditEventStore"]

_PAGE: Final = 1000
_UNREACHED: Final = 2**62
"""A sequence no log reaches: an append at it can only be refused."""
MIN_HEAD_KEY_BYTES: Final = 16


class AuditEventStore(EventStoreDecorator):
    """Hash-chains each execution's events; :meth:`verify` walks them, :meth:`export_head`
    anchors the tail. ``head_key`` (bytes, optional) signs exported heads with HMAC-SHA256
    and makes :meth:`verify` require that signature. ``tip_cache_size`` (an int >= 0) is
    how many executions' chain tips are remembered to spare fenced appends a read; 0
    reads the predecessor for every append."""

    def __init__(
        self,
        inner: EventStore,
        *,
        head_key: bytes | None = None,
        tip_cache_size: int = DEFAULT_TIP_CACHE_SIZE,
    ) -> None:
        if head_key is not None and (
            not isinstance(head_key, bytes) or len(head_key) < MIN_HEAD_KEY_BYTES
        ):
            raise InvalidOptionError(
                f"head_key must be bytes of at least {MIN_HEAD_KEY_BYTES} (a random secret)"
            )
        if (
            not isinstance(tip_cache_size, int) or isinstance(tip_cache_size, bool)
            or tip_cache_size < 0
        ):
            raise InvalidOptionError(
                f"tip_cache_size must be an int >= 0 (executions remembered), "
                f"not {tip_cache_size!r}"
            )
        if find_layers(inner, AuditEventStore):
            # The outer chain's link would reach the inner one as caller metadata under
            # its reserved key, and every append would be refused.
            raise InvalidOptionError(
                "the store is already audited (an audit layer is below this one): one "
                "chain covers every layer above it; give 'audit' once in decorators=[...]"
            )
        super().__init__(inner)
        self._head_key = head_key
        self._tips = ChainTips(tip_cache_size)

    async def _prev(self, execution_id: str, expected_sequence: int) -> str | None:
        """The hash an append at ``expected_sequence`` links to, read from the store."""
        if expected_sequence == 0:
            return GENESIS
        before = await self.inner.read(
            execution_id, from_sequence=expected_sequence - 1, to_sequence=expected_sequence - 1
        )
        if before:
            link = read_link(before[0].metadata)
            # An unchained predecessor (a log older than the decorator) has no hash to
            # link to; verify reports it as the break.
            return None if link is None else link.hash
        # No predecessor: the append is wrong, or the predecessor was truncated away,
        # which leaves nothing to link to.
        head = await self.inner.head(execution_id)
        if head != expected_sequence:
            raise SequenceConflictError(execution_id, expected_sequence, head)
        return None

    async def _refuse_unlinkable(
        self, execution_id: str, events: Sequence[NewEvent], observed_fence: int
    ) -> None:
        """An ``append_if_unchanged`` past the head: the store below checks the token
        before the sequence, so a stale token must be what the caller hears. Ask the store
        with a sequence no log reaches, which it can only refuse, and raise its
        ``StaleFenceError`` (the caller then re-raises its sequence conflict)."""
        with contextlib.suppress(SequenceConflictError):
            await self.inner.append_if_unchanged(
                execution_id, events, expected_sequence=_UNREACHED,
                observed_fence=observed_fence,
            )
            raise AssertionError(
                f"the store below accepted an append at sequence {_UNREACHED}"
            )

    async def _refuse_earlier(
        self, chained: list[AppendRequest], request: AppendRequest, events: Sequence[NewEvent]
    ) -> None:
        """An ``append_many`` whose request ``request`` cannot be linked (past its head):
        the store below takes the requests in order, so an earlier one's refusal (a stale
        token) must be what the caller hears. Ask the store with the earlier requests and
        this one at a sequence no log reaches, which it can only refuse, and raise what it
        refuses an earlier request with (the caller then re-raises its sequence conflict)."""
        probe = AppendRequest(request.execution_id, events, _UNREACHED, request.fence)
        try:
            await self.inner.append_many([*chained, probe])
        except SequenceConflictError as refused:
            if refused.execution_id == request.execution_id:
                return
            raise
        raise AssertionError(f"the store below accepted an append at sequence {_UNREACHED}")

    async def _chained(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        expected_sequence: int,
        *,
        stamped: int | None,
        guarded_by: int | None,
        seen: Tip | None,
    ) -> list[NewEvent]:
        """``events`` linked for an append that stamps ``stamped`` and that the store
        accepts only under the token ``guarded_by`` (None: no token check); ``seen`` is
        the tip remembered when the append began."""
        if (
            seen is not None and guarded_by is not None and seen.fence == guarded_by
            and seen.next_sequence == expected_sequence
        ):
            prev: str | None = seen.hash
        else:
            prev = await self._prev(execution_id, expected_sequence)
        return chain_events(execution_id, expected_sequence, events, prev, stamped)

    def _landed(
        self,
        execution_id: str,
        chained: Sequence[NewEvent],
        expected_sequence: int,
        guarded_by: int | None,
        seen: Tip | None,
    ) -> None:
        """After a successful append: remember where it left the chain, when the token
        it was accepted under is known; otherwise the tip it saw is behind the head."""
        if guarded_by is None:
            self._tips.forget_if_still(execution_id, seen)
            return
        field = chained[-1].metadata[CHAIN_FIELD]  # as chain_events wrote it
        assert isinstance(field, dict)
        last = field["hash"]
        assert isinstance(last, str)
        self._tips.record(execution_id, Tip(expected_sequence + len(chained), last, guarded_by))

    # -- required ------------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        """Link the events after the actual predecessor, then append. Refuses user metadata
        that sets ``chain`` (InvalidEventError)."""
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        if fence is not None:
            fence = check_fence(fence)
        refuse_chain_field(checked)
        seen = self._tips.get(execution_id)
        if (
            fence is None and seen is not None and seen.next_sequence == expected_sequence
            and "append_if_unchanged" in self.inner.capabilities
        ):
            unchanged = await self._append_unchanged(execution_id, checked, seen)
            if unchanged is not None:
                return unchanged
            seen = None  # refused under the tip's token: dropped, read the predecessor
        try:
            chained = await self._chained(
                execution_id, checked, expected_sequence, stamped=fence, guarded_by=fence,
                seen=seen,
            )
            written = await self.inner.append(
                execution_id, chained, expected_sequence=expected_sequence, fence=fence
            )
        except BaseException:
            self._tips.forget_if_still(execution_id, seen)
            raise
        # A log created unfenced is remembered under token 0, the guess the module
        # docstring explains; any other unfenced append leaves no token to remember.
        guarded_by = 0 if fence is None and expected_sequence == 0 else fence
        self._landed(execution_id, chained, expected_sequence, guarded_by, seen)
        return _unlinked(written)

    async def _append_unchanged(
        self, execution_id: str, events: Sequence[NewEvent], seen: Tip
    ) -> tuple[Event, ...] | None:
        """An unfenced append at the tip's sequence, made ``append_if_unchanged`` under
        its token and linked after its hash; None when the store refused that token
        (nothing was written, and the tip is dropped)."""
        chained = chain_events(execution_id, seen.next_sequence, events, seen.hash, None)
        try:
            written = await self.inner.append_if_unchanged(
                execution_id, chained, expected_sequence=seen.next_sequence,
                observed_fence=seen.fence,
            )
        except StaleFenceError:
            self._tips.forget_if_still(execution_id, seen)
            return None
        except BaseException:
            self._tips.forget_if_still(execution_id, seen)
            raise
        self._landed(execution_id, chained, seen.next_sequence, seen.fence, seen)
        return _unlinked(written)

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        """The events without their links (see :meth:`read_chained`)."""
        return _unlinked(
            await self.inner.read(
                execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
            )
        )

    async def read_chained(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        """The events as stored, each with ``metadata["chain"]`` (see
        :func:`~loom_audit.read_link`)."""
        return await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )

    # -- optional ------------------------------------------------------------------------

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        observed_fence = check_fence(observed_fence, "observed_fence")
        refuse_chain_field(checked)
        seen = self._tips.get(execution_id)
        try:
            try:
                chained = await self._chained(
                    execution_id, checked, expected_sequence, stamped=None,
                    guarded_by=observed_fence, seen=seen,
                )
            except SequenceConflictError:
                await self._refuse_unlinkable(execution_id, checked, observed_fence)
                raise
            written = await self.inner.append_if_unchanged(
                execution_id, chained, expected_sequence=expected_sequence,
                observed_fence=observed_fence,
            )
        except BaseException:
            self._tips.forget_if_still(execution_id, seen)
            raise
        self._landed(execution_id, chained, expected_sequence, observed_fence, seen)
        return _unlinked(written)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        for i, (_, events) in enumerate(checked):
            refuse_chain_field(events, f"requests[{i}].events")
        # Ids are distinct (check_append_requests refuses a repeated one).
        seen = {request.execution_id: self._tips.get(request.execution_id)
                for request, _ in checked}
        try:
            chained: list[AppendRequest] = []
            for request, events in checked:
                try:
                    linked = await self._chained(
                        request.execution_id, events, request.expected_sequence,
                        stamped=request.fence, guarded_by=request.fence,
                        seen=seen[request.execution_id],
                    )
                except SequenceConflictError:
                    await self._refuse_earlier(chained, request, events)
                    raise
                chained.append(AppendRequest(
                    request.execution_id, linked, request.expected_sequence, request.fence
                ))
            written = await self.inner.append_many(chained)
        except BaseException:
            for execution_id, tip in seen.items():
                self._tips.forget_if_still(execution_id, tip)
            raise
        for request in chained:
            self._landed(
                request.execution_id, request.events, request.expected_sequence,
                request.fence, seen[request.execution_id],
            )
        return tuple(_unlinked(batch) for batch in written)

    async def delete_execution(self, execution_id: str) -> bool:
        execution_id = check_execution_id(execution_id)
        try:
            return await self.inner.delete_execution(execution_id)
        finally:
            self._tips.forget(execution_id)

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        execution_id = check_execution_id(execution_id)
        try:
            return await self.inner.truncate_prefix_keeping(
                execution_id, keep_from_sequence=keep_from_sequence
            )
        finally:
            self._tips.forget(execution_id)

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        return self._unlinking(self.inner.subscribe(execution_id, from_sequence=from_sequence))

    async def _unlinking(self, source: AsyncIterator[Event]) -> AsyncIterator[Event]:
        try:
            async for event in source:
                yield _unlinked((event,))[0]
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    # -- the chain -----------------------------------------------------------------------

    async def export_head(self, execution_id: str) -> ChainHead:
        """The last event's sequence and link hash (signed under ``head_key`` if set).

        Export it after :meth:`verify` says the chain holds, and keep it out of reach of
        whoever can write the database. Refuses (:class:`~loom_audit.NoHeadError`) a log
        whose last event is gone or unchained.
        """
        execution_id = check_execution_id(execution_id)
        head = await self.inner.head(execution_id)
        if head == 0:
            raise ExecutionNotFoundError(execution_id)
        last = await self.inner.read(execution_id, from_sequence=head - 1, to_sequence=head - 1)
        link = read_link(last[0].metadata) if last else None
        if link is None:
            raise NoHeadError(execution_id, head - 1)
        signature = (
            None if self._head_key is None
            else sign_head(self._head_key, execution_id, head - 1, link.hash)
        )
        return ChainHead(execution_id, head - 1, link.hash, signature)

    async def verify(
        self,
        execution_id: str,
        *,
        head: ChainHead | None = None,
        allow_truncated_prefix: bool = False,
    ) -> Verification:
        """Walk every link of ``execution_id``'s log and report the first broken one
        (:class:`~loom_audit.ChainBroken`) or :class:`~loom_audit.ChainIntact`.

        With ``head``, also detect a removed tail and a rewrite up to the head (see
        :mod:`loom_audit.verification` for what is and is not detected). The store's own
        head is checked against the chain: the last link must be at ``head() - 1``, and a
        row that ``read`` returns at or past the head is reported (``beyond_head``). Events
        appended after the walk started are not part of it. A log that was never written
        (no head, no row) raises ExecutionNotFoundError unless a head says it existed.
        """
        execution_id = check_execution_id(execution_id)
        walk = ChainWalk(
            execution_id, head=head, head_key=self._head_key,
            allow_truncated_prefix=allow_truncated_prefix,
        )
        store_head = await self.inner.head(execution_id)
        if store_head == 0:
            beyond = await self._beyond_head(execution_id, 0)
            if beyond is not None:
                return beyond
            if head is None:
                raise ExecutionNotFoundError(execution_id)
        next_sequence = 0
        while next_sequence < store_head:
            try:
                page = await self.inner.read(
                    execution_id, from_sequence=next_sequence, to_sequence=store_head - 1,
                    limit=_PAGE,
                )
            except PayloadShreddedError as exc:
                # Only when the chain sits above crypto (the wrong order): it needs keys.
                return walk.fail(
                    exc.sequence, "unreadable",
                    f"{exc}; put the audit decorator below crypto so the chain covers "
                    "ciphertext and verifies without keys",
                )
            for event in page:
                if walk.step(event) is not None:
                    return walk.finish(store_head)
            if len(page) < _PAGE:
                break
            next_sequence = page[-1].sequence + 1
        verdict = walk.finish(store_head)
        if verdict.ok:
            beyond = await self._beyond_head(execution_id, store_head)
            if beyond is not None:
                return beyond
        return verdict

    async def _beyond_head(self, execution_id: str, store_head: int) -> ChainBroken | None:
        """A row ``read`` returns at or past ``store_head`` that the head still does not
        cover once re-read (one appended meanwhile moved the head past it: not a break)."""
        past = await self.inner.read(execution_id, from_sequence=store_head, limit=1)
        if not past:
            return None
        now = await self.inner.head(execution_id)
        if past[0].sequence < now:
            return None
        return ChainBroken(
            execution_id, past[0].sequence, "beyond_head",
            f"read returns an event at sequence {past[0].sequence}, but the store's head is "
            f"{now}: a row outside the log (inserted without moving the head, or the head "
            "moved back), which the chain does not cover",
        )

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=Implement(append_if_unchanged),
        append_many=Implement(append_many),
        delete_execution=Implement(delete_execution),
        copy_prefix=Refuse(
            "every chain link hashes its execution id, so copied events would not verify in "
            "the target; branch by reading the prefix and appending it to the target through "
            "the audit decorator, which starts the target's own chain"
        ),
        truncate_prefix_keeping=Implement(truncate_prefix_keeping),
        subscribe=Implement(subscribe),
    )


def _unlinked(events: Sequence[Event]) -> tuple[Event, ...]:
    # Built directly rather than with dataclasses.replace, which costs several times more
    # on the path every append and read takes.
    return tuple([
        build_event(
            e.execution_id, e.sequence, e.kind, e.payload, without_chain(e.metadata),
            e.recorded_at,
        ) if CHAIN_FIELD in e.metadata else e
        for e in events
    ])

