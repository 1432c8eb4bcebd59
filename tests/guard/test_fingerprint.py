"""Fingerprints: sha256 of the tool name and the canonical JSON of the arguments.

Only object key order is normalised. Everything a model could vary on purpose — whitespace,
list order, number spelling, page numbers, cursors, message text — must change the
fingerprint, and anything JSON cannot represent exactly must be refused with
``BadArguments`` rather than guessed at.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from guard.steps import BadArguments, canonical_json, fingerprint


def differ(left: dict[str, Any], right: dict[str, Any], tool: str = "search") -> bool:
    return fingerprint(tool, left) != fingerprint(tool, right)


def nested_lists(levels: int) -> dict[str, Any]:
    """``{"a": [[...]]}`` with ``levels`` containers counting the outer object."""
    value: Any = []
    for _ in range(levels - 2):
        value = [value]
    return {"a": value}


# -- what does not matter -----------------------------------------------------------------


def test_key_order_does_not_change_the_fingerprint() -> None:
    assert not differ({"a": 1, "b": 2, "c": 3}, {"c": 3, "a": 1, "b": 2})


def test_key_order_inside_nested_objects_does_not_change_the_fingerprint() -> None:
    left = {"filter": {"status": "open", "owner": "ana"}, "page": 1}
    right = {"page": 1, "filter": {"owner": "ana", "status": "open"}}
    assert not differ(left, right)


def test_canonical_json_sorts_keys_and_has_no_padding() -> None:
    assert canonical_json({"b": [1, 2], "a": {"y": None, "x": True}}) == (
        '{"a":{"x":true,"y":null},"b":[1,2]}'
    )


def test_the_same_call_always_has_the_same_fingerprint() -> None:
    args = {"query": "refund", "page": 2}
    assert fingerprint("search", args) == fingerprint("search", dict(args))
    assert len(fingerprint("search", args)) == 64
    int(fingerprint("search", args), 16)  # hex digits only


# -- what does matter ---------------------------------------------------------------------


def test_whitespace_inside_strings_changes_the_fingerprint() -> None:
    assert differ({"q": "a b"}, {"q": "a  b"})
    assert differ({"q": "refund"}, {"q": "refund "})
    assert differ({"q": "refund"}, {"q": "refund\n"})


def test_list_order_changes_the_fingerprint() -> None:
    assert differ({"ids": [1, 2, 3]}, {"ids": [3, 2, 1]})


def test_an_integer_and_the_equal_float_have_different_fingerprints() -> None:
    assert differ({"amount": 1}, {"amount": 1.0})


def test_a_boolean_and_the_equal_integer_have_different_fingerprints() -> None:
    assert differ({"flag": True}, {"flag": 1})


def test_page_numbers_change_the_fingerprint() -> None:
    assert differ({"page": 1}, {"page": 2})


def test_cursors_change_the_fingerprint() -> None:
    assert differ({"cursor": "eyJpZCI6MTB9"}, {"cursor": "eyJpZCI6MjB9"})


def test_message_text_changes_the_fingerprint() -> None:
    assert differ({"to": "ops", "text": "Disk full"}, {"to": "ops", "text": "Disk full."})


def test_a_missing_argument_and_a_null_argument_have_different_fingerprints() -> None:
    assert differ({}, {"cursor": None})


def test_the_tool_name_is_part_of_the_fingerprint() -> None:
    args = {"id": 42}
    assert fingerprint("get_ticket", args) != fingerprint("delete_ticket", args)


def test_unicode_is_kept_as_written() -> None:
    text = canonical_json({"msg": "héllo 世界 🚀"})
    assert "héllo 世界 🚀" in text
    assert json.loads(text) == {"msg": "héllo 世界 🚀"}


def test_unicode_is_not_normalised() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert differ({"name": composed}, {"name": decomposed})


def test_a_tuple_is_accepted_and_reads_as_the_equal_json_list() -> None:
    assert canonical_json({"ids": (1, 2)}) == canonical_json({"ids": [1, 2]}) == '{"ids":[1,2]}'
    assert not differ({"ids": (1, 2)}, {"ids": [1, 2]})
    assert differ({"ids": (1, 2)}, {"ids": (2, 1)})


# -- what is refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf")],
    ids=["nan", "inf", "-inf"],
)
def test_non_finite_numbers_are_refused(value: float) -> None:
    with pytest.raises(BadArguments):
        fingerprint("charge", {"amount": value})


def test_a_non_finite_number_deep_inside_a_list_is_refused() -> None:
    with pytest.raises(BadArguments):
        fingerprint("charge", {"lines": [{"amount": [1.5, float("nan")]}]})


@pytest.mark.parametrize(
    "value",
    [{1, 2}, frozenset({1}), b"bytes", bytearray(b"x"), object(), 1j, Ellipsis],
    ids=["set", "frozenset", "bytes", "bytearray", "object", "complex", "ellipsis"],
)
def test_values_json_cannot_hold_are_refused(value: object) -> None:
    with pytest.raises(BadArguments):
        fingerprint("search", {"q": value})


@pytest.mark.parametrize("key", [1, 1.5, None, True, ("a", "b")], ids=repr)
def test_non_string_keys_are_refused(key: object) -> None:
    with pytest.raises(BadArguments):
        fingerprint("search", {"filter": {key: "x"}})


def test_a_non_string_key_at_the_top_level_is_refused() -> None:
    with pytest.raises(BadArguments):
        canonical_json({1: "x"})  # type: ignore[dict-item]


def test_bad_arguments_is_a_value_error() -> None:
    assert issubclass(BadArguments, ValueError)


def test_a_dict_that_contains_itself_is_refused() -> None:
    args: dict[str, Any] = {"a": 1}
    args["self"] = args
    with pytest.raises(BadArguments):
        fingerprint("search", args)


def test_a_list_that_contains_itself_is_refused() -> None:
    items: list[Any] = [1, 2]
    items.append(items)
    with pytest.raises(BadArguments):
        fingerprint("search", {"items": items})


def test_a_cycle_through_several_containers_is_refused() -> None:
    inner: dict[str, Any] = {}
    outer = {"list": [{"inner": inner}]}
    inner["back"] = outer
    with pytest.raises(BadArguments):
        fingerprint("search", outer)


def test_ten_thousand_levels_of_nesting_are_refused_without_a_recursion_error() -> None:
    with pytest.raises(BadArguments):
        fingerprint("search", nested_lists(10_000))


def test_ten_thousand_levels_of_nested_objects_are_refused() -> None:
    value: dict[str, Any] = {}
    for _ in range(10_000):
        value = {"a": value}
    with pytest.raises(BadArguments):
        canonical_json(value)


def test_nesting_of_two_hundred_levels_is_accepted_and_one_more_is_refused() -> None:
    canonical_json(nested_lists(200))
    with pytest.raises(BadArguments):
        canonical_json(nested_lists(201))


# -- what is fine -------------------------------------------------------------------------


def test_the_same_list_shared_by_two_arguments_is_fine() -> None:
    shared = [1, 2, 3]
    args = {"a": shared, "b": shared, "c": {"again": shared}}
    assert canonical_json(args) == '{"a":[1,2,3],"b":[1,2,3],"c":{"again":[1,2,3]}}'
    assert fingerprint("merge", args) == fingerprint(
        "merge", {"a": [1, 2, 3], "b": [1, 2, 3], "c": {"again": [1, 2, 3]}}
    )


def test_the_same_object_shared_at_different_depths_is_fine() -> None:
    shared = {"id": 7}
    args = {"deep": [[[shared]]], "top": shared, "twice": [shared, shared]}
    assert json.loads(canonical_json(args)) == {
        "deep": [[[{"id": 7}]]],
        "top": {"id": 7},
        "twice": [{"id": 7}, {"id": 7}],
    }


def test_a_five_megabyte_string_argument_fingerprints_fine() -> None:
    body = "x" * (5 * 1024 * 1024)
    digest = fingerprint("upload", {"body": body})
    assert digest == fingerprint("upload", {"body": body})
    assert digest != fingerprint("upload", {"body": body + "x"})
