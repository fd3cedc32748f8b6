"""The id encoding: injective, prefix-free, order-preserving; hostile names handled."""

from __future__ import annotations

import itertools
import random

import pytest
from loom_tenant import MAX_TENANT_BYTES, TenantCodec, check_tenant

from loom_core import InvalidExecutionIdError, InvalidOptionError
from loom_core.spi import MAX_ID_BYTES

HOSTILE_TENANTS = [
    "",
    "a",
    "a/",
    "a:",
    "1:a/",
    "0:/",
    "/",
    ":",
    "10:",
    "acme",
    "acme/x",
    "ü",
    "日本語",
    "🙂",
    " ",
    "x" * MAX_TENANT_BYTES,
    "é" * (MAX_TENANT_BYTES // 2),
]
HOSTILE_IDS = ["x", "/", ":", "a/x", "1:a/x", "0:/x", "/x", "ü", "🙂", " ", "x" * 300, "1:", "10"]


def _random_text(rng: random.Random, alphabet: str, longest: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


def test_distinct_tenant_and_id_pairs_never_share_a_stored_id() -> None:
    rng = random.Random(5)
    alphabet = "ab/:0123456789é🙂"
    tenants = set(HOSTILE_TENANTS) | {_random_text(rng, alphabet, 6) for _ in range(200)}
    ids = set(HOSTILE_IDS) | {_random_text(rng, alphabet, 6) or "z" for _ in range(200)}
    seen: dict[str, tuple[str, str]] = {}
    for tenant, raw in itertools.product(tenants, ids):
        codec = TenantCodec(tenant)
        if len(raw.encode()) > codec.id_budget:
            continue
        stored = codec.encode(raw)
        assert seen.setdefault(stored, (tenant, raw)) == (tenant, raw)


def test_a_stored_id_decodes_under_its_own_tenant_only() -> None:
    codecs = [TenantCodec(t) for t in HOSTILE_TENANTS]
    for owner in codecs:
        for raw in HOSTILE_IDS:
            if len(raw.encode()) > owner.id_budget:
                continue
            stored = owner.encode(raw)
            decoders = [c.tenant for c in codecs if c.decode(stored) is not None]
            assert decoders == [owner.tenant]
            assert owner.decode(stored) == raw


def test_no_tenant_prefix_is_a_prefix_of_another() -> None:
    prefixes = [TenantCodec(t).prefix for t in HOSTILE_TENANTS]
    for one, other in itertools.permutations(prefixes, 2):
        assert not other.startswith(one)


def test_a_tenants_stored_ids_sort_like_its_ids_and_stay_contiguous() -> None:
    rng = random.Random(7)
    alphabet = "ab/:0é🙂\U0010fffd"
    mixed: list[tuple[str, str]] = []
    for tenant in ["a", "a/", "", "1:a/", "ab"]:
        codec = TenantCodec(tenant)
        raws = {_random_text(rng, alphabet, 5) or "q" for _ in range(60)}
        mixed += [(codec.encode(raw), tenant) for raw in raws]
        assert sorted(raws) == [codec.decode(s) for s in sorted(codec.encode(r) for r in raws)]
    owners = [tenant for _, tenant in sorted(mixed)]
    runs = [tenant for tenant, _ in itertools.groupby(owners)]
    assert len(runs) == len(set(runs)), "a tenant's ids are split by another tenant's"


@pytest.mark.parametrize(
    "tenant",
    ["\x00", "ac\x00me", "a\nb", "\x7f", "tab\there"],
    ids=["nul", "embedded-nul", "newline", "del", "tab"],
)
def test_tenant_with_a_control_character_is_refused(tenant: str) -> None:
    with pytest.raises(InvalidOptionError, match="control character"):
        TenantCodec(tenant)


def test_tenant_longer_than_the_limit_is_refused_and_the_limit_itself_is_accepted() -> None:
    assert check_tenant("x" * MAX_TENANT_BYTES) == "x" * MAX_TENANT_BYTES
    with pytest.raises(InvalidOptionError, match=f"the limit is {MAX_TENANT_BYTES}"):
        TenantCodec("x" * (MAX_TENANT_BYTES + 1))
    with pytest.raises(InvalidOptionError, match="limit"):
        TenantCodec("é" * MAX_TENANT_BYTES)  # 2 bytes each: over the byte limit


def test_tenant_that_is_not_text_or_holds_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="must be a str"):
        TenantCodec(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="surrogate"):
        TenantCodec("a\ud800")


def test_ids_up_to_the_tenant_budget_are_accepted_and_longer_ones_refused() -> None:
    codec = TenantCodec("acme")
    assert codec.id_budget == MAX_ID_BYTES - len("4:acme/")
    longest = "i" * codec.id_budget
    assert len(codec.encode(longest).encode()) == MAX_ID_BYTES
    with pytest.raises(InvalidExecutionIdError, match="under tenant 'acme' the limit is"):
        codec.encode(longest + "i")


def test_the_longest_tenant_still_leaves_room_for_long_ids() -> None:
    assert TenantCodec("x" * MAX_TENANT_BYTES).id_budget >= 379


@pytest.mark.parametrize("raw", ["", "a\x00", "\n", 7], ids=["empty", "nul", "newline", "int"])
def test_an_invalid_id_is_refused_as_the_inner_store_would(raw: object) -> None:
    with pytest.raises(InvalidExecutionIdError):
        TenantCodec("acme").encode(raw)
