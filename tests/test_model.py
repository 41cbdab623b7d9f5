"""The vocabulary of a group (core.model): names, resources, progress encoding, stability."""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.model import (
    MAX_NAME_LENGTH,
    MAX_PROGRESS_BYTES,
    MAX_RESOURCE_ID_BYTES,
    Claim,
    CoordinatorRecord,
    GroupState,
    JsonValue,
    MemberRecord,
    Phase,
    Resource,
    Target,
    UnreadableProgress,
    decode_progress,
    encode_progress,
    validate_group,
    validate_member_id,
    validate_resource_id,
)

PROPS = settings(max_examples=500, deadline=None)
ALNUM = frozenset(string.ascii_letters + string.digits)
# Any code point, unpaired surrogates and control characters included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=200)
Validator = Callable[[object], str]


def test_limits() -> None:
    assert (MAX_NAME_LENGTH, MAX_RESOURCE_ID_BYTES, MAX_PROGRESS_BYTES) == (128, 1024, 524288)


# --- group names and member ids -------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "0", "orders", "orders-2024.v1_eu", "A.b_c-d", "x" * MAX_NAME_LENGTH]
)
def test_usable_group_names_are_returned_unchanged(name: str) -> None:
    assert validate_group(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "/orders",
        "orders/",
        "a\\b",
        "..",
        ".",
        "../etc",
        ".hidden",
        "-a",
        "_a",
        "a b",
        "a:b",
        "a@b",
        "a\nb",
        "orders\n",
        "a\x00b",
        "é",
        "\uff41",  # a fullwidth letter, not ASCII
        "x" * (MAX_NAME_LENGTH + 1),
    ],
)
def test_unusable_group_names_are_refused_naming_the_value(name: str) -> None:
    shown = name if len(name) <= 80 else name[:77] + "..."
    with pytest.raises(ConfigurationError, match=re.escape(f"group name {shown!r} is invalid")):
        validate_group(name)


@pytest.mark.parametrize("name", ["a", "host-1.example.com:4040@exec-7", "0:1", "a_b.c-d"])
def test_usable_member_ids_are_returned_unchanged(name: str) -> None:
    assert validate_member_id(name) == name


@pytest.mark.parametrize(
    "name", ["", "a/b", "..", ":a", "@a", "a b", "a\tb", "a\nb", "x" * (MAX_NAME_LENGTH + 1)]
)
def test_unusable_member_ids_are_refused_naming_the_value(name: str) -> None:
    shown = name if len(name) <= 80 else name[:77] + "..."
    with pytest.raises(ConfigurationError, match=re.escape(f"member id {shown!r} is invalid")):
        validate_member_id(name)


@pytest.mark.parametrize(
    ("validator", "kind"),
    [
        (validate_group, "group name"),
        (validate_member_id, "member id"),
        (validate_resource_id, "resource id"),
    ],
)
@pytest.mark.parametrize("value", [None, 7, b"orders", ["orders"]])
def test_names_must_be_strings(validator: Validator, kind: str, value: object) -> None:
    expected = f"{kind} must be a string, got {type(value).__name__} {value!r}"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        validator(value)


# --- resource ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resource",
    [
        "r",
        "s3://bucket/prefix/2024/",
        "/data/in/part-0001.parquet",
        "a/../b",
        "..",
        "queue name with spaces",
        "naïve/日本語/😀",
        "x" * MAX_RESOURCE_ID_BYTES,
        "é" * (MAX_RESOURCE_ID_BYTES // 2),
        "😀" * (MAX_RESOURCE_ID_BYTES // 4),
    ],
)
def test_usable_resource_ids_are_returned_unchanged(resource: str) -> None:
    assert validate_resource_id(resource) == resource


@pytest.mark.parametrize(
    ("resource", "bad"),
    [
        ("a\x00b", "\x00"),
        ("a\nb", "\n"),
        ("line\r", "\r"),
        ("tab\there", "\t"),
        ("del\x7f", "\x7f"),
        ("half \ud83d of an emoji", "\ud83d"),
        ("low \udc00 surrogate", "\udc00"),
    ],
)
def test_control_and_unpaired_characters_are_refused_naming_them(resource: str, bad: str) -> None:
    expected = f"resource id {resource!r} contains the control or unpaired character {bad!r}"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        validate_resource_id(resource)


@pytest.mark.parametrize(
    ("resource", "size"),
    [
        ("", 0),
        ("x" * (MAX_RESOURCE_ID_BYTES + 1), MAX_RESOURCE_ID_BYTES + 1),
        ("é" * (MAX_RESOURCE_ID_BYTES // 2) + "x", MAX_RESOURCE_ID_BYTES + 1),
        ("😀" * 257, 1028),
    ],
)
def test_empty_and_oversized_resource_ids_are_refused_with_their_size(
    resource: str, size: int
) -> None:
    shown = f"{resource[:60]!r}{'...' if len(resource) > 60 else ''}"
    with pytest.raises(
        ConfigurationError, match=re.escape(f"resource id {shown} is {size} bytes long")
    ):
        validate_resource_id(resource)


def group_name_oracle(value: str) -> bool:
    return (
        0 < len(value) <= MAX_NAME_LENGTH and value[0] in ALNUM and set(value) <= ALNUM | set("._-")
    )


def member_id_oracle(value: str) -> bool:
    return (
        0 < len(value) <= MAX_NAME_LENGTH
        and value[0] in ALNUM
        and set(value) <= ALNUM | set("._-:@")
    )


def resource_id_oracle(value: str) -> bool:
    size = len(value.encode("utf-8", "surrogatepass"))
    return 0 < size <= MAX_RESOURCE_ID_BYTES and all(
        c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF for c in value
    )


def outcome(validator: Validator, value: str) -> str | ConfigurationError:
    try:
        return validator(value)
    except ConfigurationError as exc:
        return exc


@PROPS
@given(
    st.one_of(
        ANY_TEXT,
        st.text(string.ascii_letters + string.digits + "._-:@/ \n", max_size=140),
        st.text(st.characters(exclude_categories=()), min_size=250, max_size=1100),
    ),
    st.sampled_from(
        [
            (validate_group, group_name_oracle),
            (validate_member_id, member_id_oracle),
            (validate_resource_id, resource_id_oracle),
        ]
    ),
)
def test_any_text_is_either_accepted_unchanged_or_a_configuration_error(
    value: str, case: tuple[Validator, Callable[[str], bool]]
) -> None:
    validator, usable = case
    result = outcome(validator, value)
    if isinstance(result, ConfigurationError):
        assert not usable(value), f"{value!r} refused: {result}"
        head = value[:20]
        if not set(head) & set("'\""):
            assert repr(head)[1:-1] in str(result), "the message shows the value"
    else:
        assert usable(value), f"{value!r} accepted"
        assert result is value


@PROPS
@given(ANY_TEXT)
def test_an_accepted_group_name_is_one_safe_path_component(value: str) -> None:
    if isinstance(outcome(validate_group, value), ConfigurationError):
        return
    assert value not in (".", "..")
    assert not set(value) & set("/\\\x00\n")


# --- resources ------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [1, 0.001, 2.5, 1e300])
def test_a_resource_weight_is_a_finite_number_above_zero(weight: float) -> None:
    assert Resource("r", weight).weight == weight
    assert Resource("r").weight == 1.0


@pytest.mark.parametrize("weight", [0, 0.0, -1, -0.5, math.inf, -math.inf, math.nan, "1", None])
def test_other_weights_are_refused_naming_the_resource_and_value(weight: object) -> None:
    expected = f"weight of resource 'r/1' is {weight!r}: use a finite number above 0"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        Resource("r/1", weight)  # type: ignore[arg-type]


def test_a_boolean_weight_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="weight of resource 'r'"):
        Resource("r", True)


def test_a_resource_id_is_validated_on_construction() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("resource id 'a\\nb' contains")):
        Resource("a\nb")


def test_resources_order_by_id_then_weight() -> None:
    assert sorted([Resource("b"), Resource("a", 2.0), Resource("a", 1.0)]) == [
        Resource("a", 1.0),
        Resource("a", 2.0),
        Resource("b"),
    ]


# --- progress -------------------------------------------------------------------------------

JSON: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=())),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@PROPS
@given(JSON)
def test_progress_round_trips(value: JsonValue) -> None:
    text = encode_progress("r", value)
    assert decode_progress("r", text) == value
    assert encode_progress("r", decode_progress("r", text)) == text


def test_progress_is_encoded_as_compact_json_with_sorted_keys() -> None:
    assert encode_progress("r", {"b": [1, 2.5], "a": None}) == '{"a":null,"b":[1,2.5]}'


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, {"offset": -math.inf}, {1, 2}, b"bytes", object(), {"a": 1, 2: 3}]
)
def test_progress_that_is_not_json_is_refused_naming_the_resource(value: object) -> None:
    with pytest.raises(
        ConfigurationError, match=re.escape("progress for resource 's3://b/p' is not JSON")
    ):
        encode_progress("s3://b/p", value)


def test_progress_with_keys_that_are_not_strings_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="progress for resource 'r'"):
        encode_progress("r", {3: 42})


def test_progress_up_to_the_limit_is_accepted_and_beyond_it_refused() -> None:
    largest = "x" * (MAX_PROGRESS_BYTES - 2)  # two quotes make it exactly the limit
    assert len(encode_progress("r", largest).encode()) == MAX_PROGRESS_BYTES
    expected = f"progress for resource 'r' is {MAX_PROGRESS_BYTES + 1} bytes as JSON"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        encode_progress("r", largest + "x")


def test_the_limit_counts_encoded_bytes_not_characters() -> None:
    # Each é is written as the six bytes \u00e9.
    too_big = "é" * (MAX_PROGRESS_BYTES // 6 + 1)
    assert len(too_big) < MAX_PROGRESS_BYTES
    with pytest.raises(ConfigurationError, match="bytes as JSON, over the limit"):
        encode_progress("r", too_big)


@pytest.mark.parametrize("text", ["", "{", "{'a': 1}", "offset=3", "[1,]"])
def test_stored_progress_that_is_not_json_is_unreadable_naming_the_resource(
    text: str,
) -> None:
    value = decode_progress("r/1", text)
    assert isinstance(value, UnreadableProgress) and value.text == text
    assert isinstance(value.error(), CorruptStateError)
    assert "stored progress of resource 'r/1' is not readable" in str(value.error())


def test_decoded_progress_is_plain_json() -> None:
    assert decode_progress("r", '{"offset":3,"files":["a","b"]}') == json.loads(
        '{"offset": 3, "files": ["a", "b"]}'
    )


# --- group stability ------------------------------------------------------------------------


def state(
    assignment: dict[str, set[str]] | None,
    claims: dict[str, str],
    *,
    members: dict[str, bool] | None = None,
    resources: set[str] | None = None,
    phase: Phase = Phase.RUNNING,
) -> GroupState:
    """A snapshot: ``members`` maps member id → leaving (default: the target's members, none
    leaving); ``resources`` defaults to those the target assigns; ``claims`` maps resource →
    member id; no target when ``assignment`` is None."""
    assigned = assignment or {}
    if members is None:
        members = dict.fromkeys(assigned, False)
    if resources is None:
        resources = {r for rs in assigned.values() for r in rs}
    target = (
        None
        if assignment is None
        else Target(
            generation=2,
            coordinator_epoch=1,
            assignment={m: frozenset(rs) for m, rs in assignment.items()},
            phase=phase,
        )
    )
    return GroupState(
        group="g",
        members={
            m: MemberRecord(m, f"{m}-session", leaving=leaving) for m, leaving in members.items()
        },
        coordinator=CoordinatorRecord("a", "a-session", 1),
        resources={r: Resource(r) for r in resources},
        resources_version=1,
        target=target,
        claims={r: Claim(r, m, f"{m}-session", 5) for r, m in claims.items()},
    )


SETTLED = {"a": {"r1", "r2"}, "b": {"r3"}}
SETTLED_CLAIMS = {"r1": "a", "r2": "a", "r3": "b"}


def test_a_settled_group_is_stable() -> None:
    assert state(SETTLED, SETTLED_CLAIMS).is_stable()


def test_a_member_with_an_empty_share_is_still_stable() -> None:
    assert state({**SETTLED, "c": set()}, SETTLED_CLAIMS).is_stable()


def test_a_resource_claimed_by_the_wrong_member_is_not_stable() -> None:
    assert not state(SETTLED, {**SETTLED_CLAIMS, "r3": "a"}).is_stable()


def test_an_unclaimed_resource_is_not_stable() -> None:
    assert not state(SETTLED, {"r1": "a", "r2": "a"}).is_stable()


def test_a_live_member_missing_from_the_target_is_not_stable() -> None:
    members = {"a": False, "b": False, "newcomer": False}
    assert not state(SETTLED, SETTLED_CLAIMS, members=members).is_stable()


def test_a_leaving_member_missing_from_the_target_is_stable() -> None:
    members = {"a": False, "b": False, "leaver": True}
    assert state(SETTLED, SETTLED_CLAIMS, members=members).is_stable()


def test_the_stopping_phase_is_not_stable() -> None:
    assert not state(SETTLED, SETTLED_CLAIMS, phase=Phase.STOPPING).is_stable()


def test_an_extra_claim_is_not_stable() -> None:
    # A removed resource still claimed, outside the target.
    assert not state(SETTLED, {**SETTLED_CLAIMS, "removed": "b"}).is_stable()


def test_a_resource_the_target_does_not_assign_is_not_stable() -> None:
    resources = {"r1", "r2", "r3", "new"}
    assert not state(SETTLED, SETTLED_CLAIMS, resources=resources).is_stable()


def test_without_a_target_only_an_empty_group_is_stable() -> None:
    assert state(None, {}, members={"a": False}, resources=set()).is_stable()
    assert not state(None, {}, members={"a": False}, resources={"r1"}).is_stable()
    assert not state(None, {"r1": "a"}, members={"a": False}, resources=set()).is_stable()


def test_owner_of_inverts_the_assignment() -> None:
    target = Target(1, 1, {"a": frozenset({"r1", "r2"}), "b": frozenset({"r3"})})
    assert target.owner_of() == SETTLED_CLAIMS
    assert target.phase is Phase.RUNNING


def test_a_grant_with_progress_keeps_every_other_field() -> None:
    import dataclasses

    from rebalancer_spark.core.model import Freed, Grant, Progress

    grant = Grant(7, Freed.RELEASED, "m1", "s1", 6, 12.5, None)
    handed = Progress("r", {"offset": 3}, 6, "m1")
    others = [f for f in dataclasses.fields(Grant) if f.name != "progress"]
    assert all(f.default != getattr(grant, f.name) for f in others)  # none left at its default
    assert grant.with_progress(handed) == dataclasses.replace(grant, progress=handed)
