"""``tenant`` above ``sharded``: what the sharded store reports reaches the tenant in the
tenant's own ids."""

from __future__ import annotations

import pytest
from loom_sharded import CrossShardError

from loom_core import AppendRequest, NewEvent, open_storage


async def test_a_cross_shard_batch_is_refused_naming_the_tenants_own_ids() -> None:
    shards = [await open_storage("memory://") for _ in range(2)]
    async with await open_storage(
        "memory://",
        decorators=[("sharded", {"shards": shards}), ("tenant", {"tenant": "acme"})],
    ) as storage:
        ids = [f"x{n}" for n in range(8)]
        with pytest.raises(CrossShardError) as refused:
            await storage.events.append_many(
                [AppendRequest(i, (NewEvent("A"),), 0) for i in ids]
            )
        assert sorted(refused.value.placement) == ids
        assert "4:acme/" not in str(refused.value)
        for execution_id in ids:
            assert await storage.events.head(execution_id) == 0
