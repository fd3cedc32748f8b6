from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import pytest

from loom_core import EventKind, NewEvent, is_answering
from loom_core.kinds import build_classification
from loom_core.spi import UnclassifiedKindError

if TYPE_CHECKING:
    from pathlib import Path

ANSWERING = {
    "EXECUTION_RESUMED",
    "EXECUTION_SUSPENDED",
    "EXECUTION_COMPLETED",
    "EXECUTION_FAILED",
    "EXECUTION_CANCELLED",
    "EXECUTION_CONTINUED",
}


@pytest.mark.parametrize("kind", sorted(k.value for k in EventKind))
def test_each_kernel_kind_is_classified_as_adr_0118_says(kind: str) -> None:
    assert is_answering(NewEvent(kind)) == (kind in ANSWERING)


def test_unknown_kind_is_ignorable() -> None:
    assert not is_answering(NewEvent("order.shipped"))


def test_unknown_kind_stamped_kernel_true_is_answering() -> None:
    assert is_answering(NewEvent("EXECUTION_REWOUND", metadata={"kernel": True}))


@pytest.mark.parametrize("stamp", ["true", 1, "True", None, False])
def test_only_json_true_counts_as_the_kernel_stamp(stamp: object) -> None:
    assert not is_answering(NewEvent("EXECUTION_REWOUND", metadata={"kernel": stamp}))  # type: ignore[dict-item]


def test_kernel_kind_ignores_the_stamp() -> None:
    assert not is_answering(NewEvent("STEP_COMPLETED", metadata={"kernel": True}))


def test_an_unclassified_kind_fails_the_build() -> None:
    class Kinds(enum.StrEnum):
        A = "A"
        B = "B"

    with pytest.raises(UnclassifiedKindError, match="'B'"):
        build_classification(Kinds, ("A",), ())


def test_a_kind_classified_twice_fails_the_build() -> None:
    class Kinds(enum.StrEnum):
        A = "A"

    with pytest.raises(UnclassifiedKindError, match="twice"):
        build_classification(Kinds, ("A",), ("A",))


def test_adding_an_unclassified_kernel_kind_fails_at_import(tmp_path: Path) -> None:
    import subprocess
    import sys
    from pathlib import Path as _Path

    import loom_core.kinds

    source = _Path(loom_core.kinds.__file__).read_text()
    anchor = '    ANNOTATION = "ANNOTATION"\n'
    assert anchor in source
    (tmp_path / "kinds_with_new_kind.py").write_text(
        source.replace(anchor, anchor + '    EXECUTION_REWOUND = "EXECUTION_REWOUND"\n')
    )
    result = subprocess.run(
        [sys.executable, "-c", "import kinds_with_new_kind"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert "UnclassifiedKindError" in result.stderr
    assert "EXECUTION_REWOUND" in result.stderr


@pytest.mark.parametrize("alone", [True, False], ids=["one event", "a batch"])
async def test_a_kernel_kind_given_as_its_enum_member_is_stored_as_its_plain_string(
    alone: bool,
) -> None:
    from loom_core.memory import MemoryEventStore
    from loom_core.spi import check_events

    kinds = [EventKind.STEP_COMPLETED] if alone else [
        EventKind.STEP_COMPLETED, EventKind.EXECUTION_COMPLETED
    ]
    events = [NewEvent(kind, {"n": 1}) for kind in kinds]
    checked = check_events(events)
    store = MemoryEventStore()
    written = await store.append("x", events, expected_sequence=0)
    for made in (checked, written, await store.read("x")):
        assert [type(e.kind) for e in made] == [str] * len(events)
        assert [e.kind for e in made] == [kind.value for kind in kinds]
    assert [is_answering(e) for e in written] == [False, True][: len(events)]
