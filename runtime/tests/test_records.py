"""json_value: what a step's or a workflow's value is recorded as, and what is refused."""

from __future__ import annotations

import enum
from collections import OrderedDict

import pytest
from loom_runtime.errors import NotJsonError
from loom_runtime.records import json_value


def _nested(levels: int, leaf: object) -> object:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("leaf", [1, "s", None, True, 1.5, {}, []])
def test_a_value_100_levels_deep_is_recorded(leaf: object) -> None:
    assert json_value(_nested(100, leaf), "v") == _nested(100, leaf)


@pytest.mark.parametrize("leaf", [1, {}, [1]])
def test_a_value_nested_past_100_levels_is_refused(leaf: object) -> None:
    with pytest.raises(NotJsonError, match="100 levels"):
        json_value(_nested(101, {"b": leaf}), "v")


def test_tuples_become_lists_at_every_depth_and_the_input_is_not_kept() -> None:
    given = {"a": (1, 2), "b": {"c": (3, {"d": (4,)})}}
    recorded = json_value(given, "v")
    assert recorded == {"a": [1, 2], "b": {"c": [3, {"d": [4]}]}}
    assert recorded is not given
    assert isinstance(recorded, dict)
    assert recorded["b"] is not given["b"]


def test_dict_subclasses_are_recorded_as_plain_dicts() -> None:
    recorded = json_value(OrderedDict(a=1), "v")
    assert recorded == {"a": 1}
    assert type(recorded) is dict


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({1: 2}, "dict key 1"),
        ({"a": {"b": {2: 1}}}, "dict key 2"),
        ({"a": float("nan")}, "nan"),
        ([float("inf")], "inf"),
        ({"a": object()}, "a object"),
        ({"a": [b"x"]}, "a bytes"),
    ],
)
def test_what_is_not_json_is_refused_naming_it(bad: object, says: str) -> None:
    with pytest.raises(NotJsonError, match=says) as refused:
        json_value(bad, "the result of step 's'")
    assert "the result of step 's'" in str(refused.value)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("a\x00b", r"U\+0000"),
        ({"k": ["é\x00"]}, r"U\+0000"),
        ({"a\x00": 1}, r"U\+0000"),
        ("\ud800", "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        ([2**14_000], "more than 14000 bits"),
        ({"a": -(2**14_000)}, "more than 14000 bits"),
    ],
)
def test_what_no_store_can_hold_is_refused_before_anything_is_written(
    bad: object, says: str
) -> None:
    # The kernel refuses these in an event; the runtime must refuse them first, or the
    # write of a step's result would fail after the step ran.
    with pytest.raises(NotJsonError, match=says):
        json_value(bad, "v")


def test_the_largest_integer_the_kernel_takes_is_recorded() -> None:
    assert json_value([2**14_000 - 1], "v") == [2**14_000 - 1]


def test_subclasses_of_json_scalars_are_recorded_as_their_plain_values() -> None:
    # What a replay reads back from the log: a live run must see the same.
    class Level(enum.IntEnum):
        HIGH = 3

    class Tag(str):
        pass

    recorded = json_value({"level": Level.HIGH, "tag": Tag("x"), "on": True, "n": [1.5]}, "v")
    assert recorded == {"level": 3, "tag": "x", "on": True, "n": [1.5]}
    assert isinstance(recorded, dict)
    assert [type(v) for v in recorded.values()] == [int, str, bool, list]
    assert type(json_value(Level.HIGH, "v")) is int


class Status(str, enum.Enum):  # noqa: UP042  (the mixin, whose str() names the member)
    PAID = "paid"


class Shouted(str):
    def __str__(self) -> str:
        return self.upper()


class Rounded(float):
    def __float__(self) -> float:
        return float(round(self))


class Doubled(int):
    def __int__(self) -> int:
        return 2 * int.__int__(self)


@pytest.mark.parametrize(
    ("given", "recorded"),
    [
        (Status.PAID, "paid"),
        ({Status.PAID: [Status.PAID]}, {"paid": ["paid"]}),
        (Shouted("quiet"), "quiet"),
        ({Shouted("key"): Shouted("value")}, {"key": "value"}),
        (Rounded(1.25), 1.25),
        (Doubled(3), 3),
    ],
)
def test_a_subclass_of_a_json_scalar_is_recorded_as_its_value_not_its_conversion(
    given: object, recorded: object
) -> None:
    # json.dumps writes a str enum's value; str() of one mixed with str names the member
    # ("Status.PAID"), and a subclass may convert itself to anything.
    value = json_value(given, "v")
    assert value == recorded
    assert repr(value) == repr(recorded)  # plain str, float and int, at every depth


def test_non_ascii_text_is_recorded() -> None:
    assert json_value({"name": "Zoë", "emoji": "🧵"}, "v") == {"name": "Zoë", "emoji": "🧵"}
