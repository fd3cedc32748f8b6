"""The ``audit`` entry point and its options."""

from __future__ import annotations

import pytest
from loom_audit import AuditDecorator, AuditEventStore, export_head, verify

from loom_core import InvalidOptionError, NewEvent, open_storage
from loom_core.spi import PluginHost


def test_the_entry_point_registers_the_audit_decorator() -> None:
    host = PluginHost()
    assert isinstance(host.decorator("audit"), AuditDecorator)
    assert host.decorators.source_of("audit") == "loom-audit"
    assert not host.errors


async def test_open_storage_chains_and_verifies_through_the_stack() -> None:
    async with open_storage("memory://", decorators=[("audit", {"head_key": b"s" * 16})]) as st:
        assert isinstance(st.events, AuditEventStore)
        await st.events.append("e", [NewEvent("X", 1)], expected_sequence=0)
        head = await export_head(st, "e")
        assert head.signature is not None
        assert (await verify(st, "e", head=head)).ok


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"head_key": "not bytes"}, "head_key must be bytes"),
        ({"head_key": b"short"}, "at least 16"),
        ({"signing": b"x" * 16}, "unknown audit options"),
    ],
)
async def test_wrong_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        await open_storage("memory://", decorators=[("audit", options)])


async def test_verify_without_an_audit_layer_is_refused() -> None:
    async with open_storage("memory://") as storage:
        with pytest.raises(InvalidOptionError, match="no audit decorator"):
            await verify(storage, "e")


async def test_a_second_audit_layer_is_refused_when_the_stack_is_opened() -> None:
    # Each would refuse every append: the outer chain's link reaches the inner one as
    # caller metadata under its reserved key.
    with pytest.raises(InvalidOptionError, match="already audited"):
        await open_storage("memory://", decorators=["audit", "audit"])
    async with open_storage("memory://", decorators=["audit"]) as storage:
        with pytest.raises(InvalidOptionError, match="already audited"):
            AuditEventStore(storage.events)
