"""Wards (resolution, composition, validation) and the immutable identity."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest

import cantrip
import gates
from cantrip import (
    ConstructionError,
    Identity,
    ImmutableError,
    Ward,
    WardSet,
    max_depth,
    max_turns,
    require_done_tool,
    timeout,
)

# -- resolution ------------------------------------------------------------------


def test_numeric_wards_resolve_to_the_minimum() -> None:
    wards = WardSet.resolve([max_turns(50), max_turns(10), max_turns(100)])
    assert wards.max_turns == 10
    assert wards.get("max_turns") == 10
    assert WardSet.resolve([timeout(30.0), timeout(2.5)]).get("timeout_s") == 2.5
    assert WardSet.resolve([max_depth(3), max_depth(1), max_depth(2)]).max_depth == 1


def test_resolution_does_not_depend_on_order() -> None:
    forward = WardSet.resolve([max_turns(7), max_turns(3), require_done_tool(True)])
    backward = WardSet.resolve([require_done_tool(True), max_turns(3), max_turns(7)])
    assert forward == backward
    assert forward.max_turns == 3


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([False], False),
        ([True], True),
        ([False, False], False),
        ([True, False], True),
        ([False, True], True),
        ([True, True], True),
    ],
)
def test_require_done_tool_resolves_with_or(flags: list[bool], expected: bool) -> None:
    wards = WardSet.resolve([require_done_tool(f) for f in flags])
    assert wards.require_done_tool is expected


def test_absent_wards_resolve_to_none_or_false() -> None:
    wards = WardSet.resolve([max_turns(4)])
    assert wards.max_depth is None
    assert wards.get("timeout_s") is None
    assert wards.require_done_tool is False


def test_kinds_resolve_independently() -> None:
    wards = WardSet.resolve([max_turns(5), max_depth(2), timeout(9), Ward("max_turns", 4)])
    assert dict(wards.values) == {"max_turns": 4, "max_depth": 2, "timeout_s": 9}


# -- composition -----------------------------------------------------------------


def test_compose_parent_and_child() -> None:
    parent = WardSet.resolve([max_turns(5), max_depth(2), require_done_tool(False)])
    child = WardSet.resolve([max_turns(10), max_depth(1), require_done_tool(True), timeout(30)])
    composed = parent.compose(child)
    assert composed.max_turns == 5  # the child cannot loosen the parent
    assert composed.max_depth == 1  # but can tighten it
    assert composed.require_done_tool is True
    assert composed.get("timeout_s") == 30  # a kind only the child has is kept
    # composition is symmetric and leaves its inputs alone
    assert child.compose(parent) == composed
    assert parent.max_turns == 5
    assert child.max_turns == 10
    assert parent.require_done_tool is False


def test_compose_keeps_parent_only_kinds() -> None:
    parent = WardSet.resolve([max_turns(3), require_done_tool(True)])
    child = WardSet.resolve([max_depth(0)])
    composed = parent.compose(child)
    assert composed.max_turns == 3
    assert composed.require_done_tool is True
    assert composed.max_depth == 0


def test_compose_with_empty_is_identity() -> None:
    wards = WardSet.resolve([max_turns(3), require_done_tool()])
    assert wards.compose(WardSet()) == wards
    assert WardSet().compose(wards) == wards


def test_as_wards_round_trips() -> None:
    wards = WardSet.resolve([max_turns(3), max_turns(8), require_done_tool(), timeout(1.5)])
    assert WardSet.resolve(wards.as_wards()) == wards


def test_circle_resolves_its_wards() -> None:
    circle = cantrip.Circle(
        [gates.done], [max_turns(20), max_turns(6), require_done_tool(False), require_done_tool()]
    )
    assert circle.resolved.max_turns == 6
    assert circle.resolved.require_done_tool is True


# -- validation ------------------------------------------------------------------


def test_unknown_ward_kind() -> None:
    with pytest.raises(ConstructionError, match="unknown ward 'max_turnz'") as info:
        Ward("max_turnz", 3)
    assert "max_turns" in str(info.value)  # the message lists the known kinds


@pytest.mark.parametrize("value", ["10", None, [3], True, False])
def test_numeric_ward_refuses_non_numbers(value: Any) -> None:
    with pytest.raises(ConstructionError, match="max_turns takes a number"):
        Ward("max_turns", value)


def test_numeric_ward_refuses_negative() -> None:
    with pytest.raises(ConstructionError, match="must not be negative"):
        max_turns(-1)
    with pytest.raises(ConstructionError, match="must not be negative"):
        timeout(-0.5)


@pytest.mark.parametrize("value", [1, 0, "true", None, 1.0])
def test_boolean_ward_refuses_non_booleans(value: Any) -> None:
    with pytest.raises(ConstructionError, match="require_done_tool takes true or false"):
        Ward("require_done_tool", value)


def test_construction_error_is_a_value_error_with_problems() -> None:
    with pytest.raises(ValueError) as info:
        Ward("nope", 1)
    assert isinstance(info.value, ConstructionError)
    assert len(info.value.problems) == 1
    assert str(info.value) == info.value.problems[0]


def test_parse_declarative_wards() -> None:
    wards = Ward.parse({"max_turns": 10, "require_done_tool": True})
    assert wards == [Ward("max_turns", 10), Ward("require_done_tool", True)]
    assert Ward.parse(max_turns(2)) == [max_turns(2)]
    with pytest.raises(ConstructionError, match="a ward is a mapping"):
        Ward.parse({})
    with pytest.raises(ConstructionError, match="unknown ward 'bogus'"):
        Ward.parse({"bogus": 1})


def test_wards_are_frozen() -> None:
    ward = max_turns(3)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ward.value = 100  # type: ignore[misc]
    assert ward.value == 3


# -- termination -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("wards", "expected"),
    [
        ([], False),
        ([max_turns(5)], True),
        ([timeout(10)], True),
        ([Ward("max_tokens_total", 1000)], True),
        ([max_depth(2)], False),
        ([require_done_tool()], False),
        ([max_depth(1), require_done_tool(), Ward("max_concurrency", 4)], False),
        ([max_depth(1), require_done_tool(), timeout(3)], True),
    ],
)
def test_guarantees_termination(wards: list[Ward], expected: bool) -> None:
    assert WardSet.resolve(wards).guarantees_termination is expected


def test_composition_keeps_termination_guarantee() -> None:
    parent = WardSet.resolve([max_turns(5)])
    child = WardSet.resolve([max_depth(1)])
    assert not child.guarantees_termination
    assert parent.compose(child).guarantees_termination


# -- identity --------------------------------------------------------------------


def full_identity() -> Identity:
    return Identity(
        system_prompt="You are terse.",
        temperature=0.2,
        top_p=0.9,
        max_tokens=256,
        stop=["END", "STOP"],
        seed=7,
        tool_choice="required",
        extra={"reasoning_effort": "low", "nested": {"a": [1, 2]}},
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("system_prompt", "You are verbose."),
        ("temperature", 1.5),
        ("top_p", 0.1),
        ("max_tokens", 9999),
        ("stop", ("x",)),
        ("seed", 8),
        ("tool_choice", "none"),
        ("extra", {"reasoning_effort": "high"}),
    ],
)
def test_identity_refuses_every_attribute_change(name: str, value: Any) -> None:
    identity = full_identity()
    before = identity.to_dict()
    with pytest.raises(ImmutableError, match="identity is immutable") as info:
        setattr(identity, name, value)
    assert repr(name) in str(info.value)
    assert identity.to_dict() == before


def test_identity_refuses_deletion() -> None:
    identity = full_identity()
    with pytest.raises(ImmutableError, match="identity is immutable"):
        del identity.temperature
    assert identity.temperature == 0.2


def test_identity_refuses_new_attributes() -> None:
    identity = full_identity()
    with pytest.raises(AttributeError):
        identity.colour = "blue"  # type: ignore[attr-defined]
    assert not hasattr(identity, "colour")


def test_identity_extra_is_read_only() -> None:
    source = {"reasoning_effort": "low"}
    identity = Identity(extra=source)
    with pytest.raises(TypeError):
        identity.extra["reasoning_effort"] = "high"  # type: ignore[index]
    source["reasoning_effort"] = "high"  # the caller's dict was copied, not shared
    assert identity.extra["reasoning_effort"] == "low"


def test_immutable_error_is_an_attribute_error() -> None:
    assert issubclass(ImmutableError, AttributeError)
    assert issubclass(ImmutableError, cantrip.CantripError)


def test_hyperparameters_only_include_what_is_set() -> None:
    assert Identity().hyperparameters() == {}
    assert Identity(temperature=0.0).hyperparameters() == {"temperature": 0.0}
    assert full_identity().hyperparameters() == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 256,
        "stop": ["END", "STOP"],
        "seed": 7,
    }
    # the system prompt, tool choice and extra are not sampling parameters
    params = full_identity().hyperparameters()
    assert "system_prompt" not in params
    assert "tool_choice" not in params
    assert "extra" not in params


def test_to_dict() -> None:
    assert Identity().to_dict() == {"system_prompt": None}
    assert full_identity().to_dict() == {
        "system_prompt": "You are terse.",
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 256,
        "stop": ["END", "STOP"],
        "seed": 7,
        "tool_choice": "required",
        "extra": {"reasoning_effort": "low", "nested": {"a": [1, 2]}},
    }


@pytest.mark.parametrize(
    "identity",
    [
        Identity(),
        Identity(system_prompt="hi"),
        Identity(temperature=0.0, seed=0),
        Identity(stop=["a"], tool_choice="auto"),
        full_identity(),
    ],
)
def test_to_dict_from_dict_round_trip(identity: Identity) -> None:
    again = Identity.from_dict(identity.to_dict())
    assert again == identity
    assert again.to_dict() == identity.to_dict()
    assert hash(again) == hash(identity)


def test_stop_is_stored_as_a_tuple() -> None:
    identity = Identity(stop=["a", "b"])
    assert identity.stop == ("a", "b")


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"extra": {"penalty": {"values": [0.5, float("-inf")]}}}, "extra.penalty.values[1]"),
    ],
)
def test_identity_refuses_nan_and_infinity_naming_the_place(
    fields: dict[str, Any], where: str
) -> None:
    """JSON has no NaN or infinity: a request carrying one would be refused by the
    provider or sent with null in its place, so the identity refuses it when built."""
    with pytest.raises(ConstructionError, match=rf"{re.escape(where)} must be a finite number"):
        Identity(**fields)
    assert Identity(temperature=0.0, extra={"penalty": [0.5, 1e308]}).temperature == 0.0
