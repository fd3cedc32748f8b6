"""How a tenant's ids are written into the shared inner store.

An id ``x`` of tenant ``t`` is stored as ``f"{len(t)}:{t}/{x}"`` (``len`` in code points).
The prefix ``f"{len(t)}:{t}/"`` is read back unambiguously (digits up to the first ``:``,
then exactly that many code points, then ``/``), so no prefix is a prefix of another
tenant's: whatever characters a tenant name or an id contains (``/``, ``:``, digits, the
empty name, another tenant's whole encoded id), two different ``(tenant, id)`` pairs never
give the same stored id, and no id of one tenant falls inside another tenant's range.

The encoding also keeps order: all of a tenant's stored ids share one prefix, so they form
one contiguous run of the inner store's code-point order, and inside it they sort exactly
as the unencoded ids do. ``list_executions`` pages over the inner store directly, with no
re-sorting and no over-fetching.

What is refused, and why:

- a tenant name that is not a ``str``, holds a control character (NUL included: no SQL
  store can index it, and an id may not hold one either) or a lone surrogate, or is longer
  than :data:`MAX_TENANT_BYTES` UTF-8 bytes (the prefix is paid out of every id's budget);
- an id whose encoded form would exceed the inner store's
  :data:`~loom_core.spi.MAX_ID_BYTES`: under a tenant an id may be at most
  ``MAX_ID_BYTES - len(prefix)`` bytes (:attr:`TenantCodec.id_budget`).

The empty tenant name is allowed: it is encoded as ``0:/`` and is as isolated as any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from loom_core.errors import InvalidExecutionIdError, InvalidOptionError
from loom_core.spi import MAX_ID_BYTES, check_key

__all__ = ["MAX_TENANT_BYTES", "TenantCodec", "check_tenant"]

_WIDEST: Final = ("", "~", "\u07ff", "\uffff")
"""The greatest character an id may hold in 0 to 3 UTF-8 bytes (U+007F is a control
character, so one byte's is ``~``)."""

MAX_TENANT_BYTES: Final = 128
"""The longest tenant name, in UTF-8 bytes; leaves at least 379 bytes for every id."""


def check_tenant(value: object) -> str:
    """A tenant name: any printable ``str`` of at most :data:`MAX_TENANT_BYTES` bytes."""
    if not isinstance(value, str):
        raise InvalidOptionError(f"tenant must be a str, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOptionError(f"tenant {value[:40]!r} contains a lone surrogate") from None
    if size > MAX_TENANT_BYTES:
        raise InvalidOptionError(
            f"tenant {value[:40]!r}… is {size} UTF-8 bytes; the limit is {MAX_TENANT_BYTES} "
            "(the tenant prefix is taken out of every execution id's 512-byte budget)"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidOptionError(
            f"tenant {value[:40]!r} contains a control character (NUL included); "
            "tenant names must be printable"
        )
    return value


@dataclass(frozen=True, slots=True)
class TenantCodec:
    """Encodes and decodes one tenant's ids (execution ids, lease keys)."""

    tenant: str
    prefix: str = field(init=False)
    id_budget: int = field(init=False)
    """The longest id, in UTF-8 bytes, this tenant may use."""

    def __post_init__(self) -> None:
        tenant = check_tenant(self.tenant)
        prefix = f"{len(tenant)}:{tenant}/"
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "id_budget", MAX_ID_BYTES - len(prefix.encode("utf-8")))

    def encode(self, value: object, what: str = "execution id") -> str:
        """The stored form of this tenant's ``value``; refuses an invalid or too-long id."""
        raw = check_key(value, what)
        size = len(raw) if raw.isascii() else len(raw.encode("utf-8"))
        if size > self.id_budget:
            raise InvalidExecutionIdError(
                raw,
                f"{what} is {size} bytes; under tenant {self.tenant!r} the limit is "
                f"{self.id_budget} (the tenant prefix takes "
                f"{MAX_ID_BYTES - self.id_budget} of the store's {MAX_ID_BYTES})",
                what,
            )
        return self.prefix + raw

    def position(self, after: object) -> str:
        """The stored cursor of ``list_executions(after=...)``: a position, so any key
        (up to the store's :data:`~loom_core.spi.MAX_ID_BYTES`) is accepted, as on a bare
        store, even one longer than the tenant's :attr:`id_budget`.

        Such an ``after`` cannot be stored under the prefix, so the cursor is the greatest
        string that fits the budget and is not above ``after``: no tenant id lies between
        the two, so the page is the same. It is ``after`` cut to the budget, plus, when the
        cut splits off a character too wide for the bytes left, the greatest character
        that fills them (every id that fits there is below ``after`` only if its next
        character is below the one cut off).
        """
        raw = check_key(after, "after")
        data = raw.encode("utf-8")
        if len(data) <= self.id_budget:
            return self.prefix + raw
        kept = data[: self.id_budget].decode("utf-8", errors="ignore")
        left = self.id_budget - len(kept.encode("utf-8"))
        return self.prefix + kept + _WIDEST[left]

    def decode(self, stored: str) -> str | None:
        """The tenant's id for a stored id, or None when it is not this tenant's."""
        if len(stored) > len(self.prefix) and stored.startswith(self.prefix):
            return stored[len(self.prefix) :]
        return None

    def owns(self, stored: str) -> bool:
        return self.decode(stored) is not None
