"""Errors from the inner store, re-addressed to the tenant's own ids.

The inner store names the stored (prefixed) id in its errors. A tenant's caller must see
its own id there, as it does in events, so a conflict or a stale fence reads the same
through the decorator as without it: the id attributes (``execution_id``, ``value``,
``key``), the keys of an id-keyed mapping (``placement``: a sharded store's
``CrossShardError`` maps each id to its shard) and the message are rewritten in place,
keeping the error's type and data.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from loom_core.errors import LoomError
from loom_tenant.codec import TenantCodec

__all__ = ["scrub", "tenant_errors"]

_ID_ATTRIBUTES = ("execution_id", "value", "key")
_ID_KEYED_ATTRIBUTES = ("placement",)


def scrub(error: LoomError, codec: TenantCodec, raw_ids: tuple[str, ...] = ()) -> None:
    """Rewrite ``error`` so every stored id of this tenant reads as the tenant's id."""
    raws = set(raw_ids)
    for attribute in _ID_ATTRIBUTES:
        value = getattr(error, attribute, None)
        if isinstance(value, str):
            raw = codec.decode(value)
            if raw is not None:
                setattr(error, attribute, raw)
                raws.add(raw)
    for attribute in _ID_KEYED_ATTRIBUTES:
        mapping = getattr(error, attribute, None)
        if isinstance(mapping, dict):
            decoded = {codec.decode(k) if isinstance(k, str) else None: v
                       for k, v in mapping.items()}
            if None not in decoded and len(decoded) == len(mapping):
                setattr(error, attribute, decoded)
                raws.update(k for k in decoded if isinstance(k, str))
    if not raws:
        return
    # Longest first, so an id that extends another is rewritten whole.
    ordered = sorted(raws, key=len, reverse=True)
    args = []
    for arg in error.args:
        if isinstance(arg, str):
            for raw in ordered:
                stored = codec.prefix + raw
                arg = arg.replace(repr(stored), repr(raw)).replace(stored, raw)
        args.append(arg)
    error.args = tuple(args)


@contextmanager
def tenant_errors(codec: TenantCodec, *raw_ids: str) -> Iterator[None]:
    """Scrub any Loom error raised inside the block; ``raw_ids`` are the call's ids."""
    try:
        yield
    except LoomError as error:
        scrub(error, codec, raw_ids)
        raise
