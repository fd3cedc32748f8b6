"""The digest of a workflow's code its log records: what it covers, and that it is taken
once the workflow's module is imported, so it sees helpers defined below the workflow."""

from __future__ import annotations

import sys
import textwrap
import types

from loom_runtime import Loom

MODULE = textwrap.dedent(
    """
    from loom_runtime import Context, Loom

    app = Loom("memory://")

    @app.workflow(name="order")
    async def order(ctx: Context) -> object:
        return await helper(ctx)

    async def helper(ctx: Context) -> object:  # defined below the workflow
        return await ctx.step(charge, {amount})

    def charge(amount: int) -> int:
        return amount
    """
)


def digest_of(source: str, module: str) -> str:
    """The digest ``app`` in ``source``, imported as ``module``, records for ``order``."""
    namespace = types.ModuleType(module)
    sys.modules[module] = namespace
    try:
        exec(compile(source, f"<{module}>", "exec"), namespace.__dict__)
        app = namespace.__dict__["app"]
        assert isinstance(app, Loom)
        return app._code_digest("order")
    finally:
        del sys.modules[module]


def test_the_same_code_has_the_same_digest() -> None:
    source = MODULE.format(amount=1)
    assert digest_of(source, "shop.flows") == digest_of(source, "shop.flows")


def test_a_helper_defined_below_the_workflow_is_covered_and_so_are_its_callees() -> None:
    assert digest_of(MODULE.format(amount=1), "shop.flows") != digest_of(
        MODULE.format(amount=2), "shop.flows"
    )
    changed_step = MODULE.replace("return amount", "return amount + 1").format(amount=1)
    assert digest_of(changed_step, "shop.flows") != digest_of(
        MODULE.format(amount=1), "shop.flows"
    )


def test_a_function_of_another_package_is_not_covered() -> None:
    """A library's functions change with its version, not with the workflow's code."""
    library = types.ModuleType("a_library")
    sys.modules["a_library"] = library
    try:
        digests = set()
        for amount in (1, 2):
            exec(
                compile(f"async def helper(ctx):\n    return {amount}\n", "<lib>", "exec"),
                library.__dict__,
            )
            source = MODULE.replace(
                "async def helper(ctx: Context) -> object:  # defined below the workflow\n"
                "    return await ctx.step(charge, {amount})\n",
                "from a_library import helper\n",
            )
            digests.add(digest_of(source, "shop.flows"))
        assert len(digests) == 1
    finally:
        del sys.modules["a_library"]
