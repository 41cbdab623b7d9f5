"""The three rebalance protocols (core.protocols.plan): what a member stops, claims and acks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer_spark.core import protocols as protocols_module
from rebalancer_spark.core.config import ProtocolName
from rebalancer_spark.core.model import Phase
from rebalancer_spark.core.protocols import MemberView, Plan, plan

COOPERATIVE = ProtocolName.COOPERATIVE
RESOURCE_BARRIER = ProtocolName.RESOURCE_BARRIER
GLOBAL_BARRIER = ProtocolName.GLOBAL_BARRIER
RESOURCES = [f"r{i}" for i in range(8)]
PROPS = settings(max_examples=300, deadline=None)
NOTHING: frozenset[str] = frozenset()


def view(
    target: set[str],
    owned: Mapping[str, int],
    *,
    generation: int = 3,
    phase: Phase = Phase.RUNNING,
) -> MemberView:
    return MemberView(generation, phase, frozenset(target), dict(owned))


def same(*resources: str, epoch: int = 1) -> dict[str, int]:
    return dict.fromkeys(resources, epoch)


def test_public_surface_is_pinned() -> None:
    assert protocols_module.__all__ == [
        "MemberHead",
        "MemberView",
        "Plan",
        "head_of",
        "idle",
        "plan",
    ]
    assert [p.value for p in ProtocolName] == ["cooperative", "global_barrier", "resource_barrier"]


# --- cooperative ----------------------------------------------------------------------------


def test_cooperative_releases_only_what_moved_away_and_claims_only_what_is_new() -> None:
    held = same("a", "b", "c")
    step = plan(COOPERATIVE, view({"b", "c", "d"}, held), held, handled_generation=3)
    assert step == Plan(
        lost=NOTHING, revoke=frozenset({"a"}), claim=frozenset({"d"}), ack=None, generation=3
    )


def test_cooperative_acks_a_new_generation_without_stopping_anything_else() -> None:
    held = same("a", "b")
    step = plan(COOPERATIVE, view({"b", "c"}, held, generation=4), held, handled_generation=3)
    assert step == Plan(NOTHING, frozenset({"a"}), frozenset({"c"}), ack=4, generation=4)


def test_a_member_holding_its_target_has_nothing_to_do() -> None:
    held = same("a", "b")
    for protocol in ProtocolName:
        step = plan(protocol, view({"a", "b"}, held), held, handled_generation=3)
        assert step == Plan(NOTHING, NOTHING, NOTHING, None, 3, settled=True), protocol


# --- resource barrier -----------------------------------------------------------------------


def test_resource_barrier_releases_everything_on_a_new_generation() -> None:
    held = same("a", "b")
    step = plan(RESOURCE_BARRIER, view({"b", "c"}, held, generation=4), held, handled_generation=3)
    assert step == Plan(
        lost=NOTHING,
        revoke=frozenset({"a", "b"}),
        claim=frozenset({"b", "c"}),
        ack=4,
        generation=4,
    )


def test_resource_barrier_is_cooperative_once_the_generation_was_handled() -> None:
    # After the eager release, claims that were not granted yet are retried, nothing is
    # released again.
    held = same("b")
    step = plan(RESOURCE_BARRIER, view({"b", "c"}, held, generation=4), held, handled_generation=4)
    assert step == Plan(NOTHING, NOTHING, frozenset({"c"}), None, 4)


# --- global barrier -------------------------------------------------------------------------


@pytest.mark.parametrize("handled", [2, 3])
@pytest.mark.parametrize("protocol", list(ProtocolName))
def test_the_stopping_phase_releases_everything_claims_nothing_and_acks(
    protocol: ProtocolName, handled: int
) -> None:
    held = same("a", "b")
    stopping = view({"a", "c"}, {**held, "x": 9}, generation=3, phase=Phase.STOPPING)
    step = plan(protocol, stopping, held, handled_generation=handled)
    assert step == Plan(NOTHING, frozenset({"a", "b", "x"}), NOTHING, 3, 3)


def test_global_barrier_claims_the_new_target_once_running_again() -> None:
    running = view({"a", "c"}, {}, generation=4)
    step = plan(GLOBAL_BARRIER, running, {}, handled_generation=3)
    assert step == Plan(NOTHING, NOTHING, frozenset({"a", "c"}), 4, 4)


# --- lost and unknown claims ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", list(ProtocolName))
def test_claims_the_store_no_longer_holds_at_our_epoch_are_lost(protocol: ProtocolName) -> None:
    held = {"same": 1, "moved-on": 2, "gone": 1}
    store = {"same": 1, "moved-on": 3}
    step = plan(protocol, view({"same", "moved-on", "gone"}, store), held, handled_generation=3)
    assert step.lost == {"moved-on", "gone"}
    assert step.revoke.isdisjoint(step.lost)


def test_a_lost_resource_still_in_the_target_is_claimed_again() -> None:
    step = plan(COOPERATIVE, view({"a", "b"}, {"a": 1}), {"a": 1, "b": 1}, handled_generation=3)
    assert step == Plan(frozenset({"b"}), NOTHING, frozenset({"b"}), ack=None, generation=3)


def test_claims_we_never_learnt_of_are_kept_if_targeted_else_released() -> None:
    store = {"a": 1, "kept": 4, "stray": 5}
    step = plan(COOPERATIVE, view({"a", "kept"}, store), {"a": 1}, handled_generation=3)
    assert step.lost == NOTHING
    assert step.revoke == {"stray"}
    assert "kept" not in step.revoke


@pytest.mark.parametrize("protocol", [COOPERATIVE, RESOURCE_BARRIER, GLOBAL_BARRIER])
def test_a_targeted_claim_we_never_learnt_of_is_taken_up(protocol: ProtocolName) -> None:
    store = {"a": 1, "kept": 4}
    step = plan(protocol, view({"a", "kept"}, store), {"a": 1}, handled_generation=3)
    assert "kept" in step.claim


def test_stopping_releases_a_claim_the_store_holds_at_another_epoch() -> None:
    stopping = view({"a"}, {"a": 2}, phase=Phase.STOPPING)
    step = plan(GLOBAL_BARRIER, stopping, {"a": 1}, handled_generation=2)
    assert step.lost == {"a"}
    assert step.ack == 3
    assert "a" in step.revoke


# --- properties -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    protocol: ProtocolName
    view: MemberView
    held: dict[str, int]
    handled: int

    @property
    def owned(self) -> Mapping[str, int]:
        """The store's claims in the view (every generated view reads them)."""
        assert self.view.owned is not None
        return self.view.owned

    @property
    def eager(self) -> bool:
        """The resource barrier's release of everything on a new generation."""
        return (
            self.protocol is RESOURCE_BARRIER
            and self.view.phase is Phase.RUNNING
            and self.view.generation > self.handled
        )


@st.composite
def cases(
    draw: st.DrawFn,
    protocols: list[ProtocolName] | None = None,
    phases: list[Phase] | None = None,
    unknown_in_target: bool = True,
) -> Case:
    """A member's beliefs and a store view that may disagree: held claims the store keeps,
    holds at another epoch or has dropped, and claims the store holds that the member never
    learnt of (only outside the target unless ``unknown_in_target``)."""
    protocol = draw(st.sampled_from(protocols or list(ProtocolName)))
    phase = draw(st.sampled_from(phases or list(Phase)))
    generation = draw(st.integers(1, 5))
    handled = draw(st.integers(0, generation))
    target = frozenset(draw(st.sets(st.sampled_from(RESOURCES))))
    epochs = st.integers(1, 4)
    held = draw(st.dictionaries(st.sampled_from(RESOURCES), epochs))
    owned: dict[str, int] = {}
    for r, e in held.items():
        fate = draw(st.sampled_from(["kept", "kept", "other epoch", "dropped"]))
        if fate == "kept":
            owned[r] = e
        elif fate == "other epoch":
            owned[r] = e + draw(st.integers(1, 3))
    for r in RESOURCES:
        if r not in held and (unknown_in_target or r not in target) and draw(st.booleans()):
            owned[r] = draw(epochs)
    return Case(protocol, MemberView(generation, phase, target, owned), held, handled)


def run(case: Case) -> Plan:
    return plan(case.protocol, case.view, case.held, case.handled)


def applied(case: Case, step: Plan) -> set[str]:
    """What the member holds once it dropped ``lost``, released ``revoke`` and was granted
    every ``claim``."""
    return (set(case.held) - step.lost - step.revoke) | step.claim


@PROPS
@given(cases())
def test_lost_is_exactly_what_the_store_no_longer_holds_at_our_epoch(case: Case) -> None:
    step = run(case)
    assert step.lost == {r for r, e in case.held.items() if case.owned.get(r) != e}
    # A lost resource is released only when the store still holds it for us at another epoch.
    assert step.lost & step.revoke <= set(case.owned)
    assert step.generation == case.view.generation


@PROPS
@given(cases())
def test_only_what_we_or_the_store_hold_is_released_and_only_the_target_is_claimed(
    case: Case,
) -> None:
    step = run(case)
    assert step.revoke <= set(case.held) | set(case.owned)
    assert step.claim <= case.view.target
    unknown = set(case.owned) - set(case.held)
    if case.view.phase is Phase.RUNNING:
        assert unknown - case.view.target <= step.revoke
        if not case.eager:
            assert not (unknown & case.view.target & step.revoke)


@PROPS
@given(cases())
def test_revoke_and_claim_are_disjoint_except_in_the_resource_barriers_eager_release(
    case: Case,
) -> None:
    step = run(case)
    if case.eager:
        unknown = {r for r, e in case.owned.items() if case.held.get(r) != e}
        assert step.revoke == (set(case.held) - step.lost) | unknown
        assert step.claim == case.view.target
    else:
        assert step.revoke.isdisjoint(step.claim)


@PROPS
@given(cases(phases=[Phase.STOPPING]))
def test_stopping_releases_everything_claims_nothing_and_acks(case: Case) -> None:
    step = run(case)
    # Everything still held, and every claim of the store's that we never learnt of or hold
    # at another epoch than the store's.
    unknown = {r for r, e in case.owned.items() if case.held.get(r) != e}
    assert step.revoke == (set(case.held) - step.lost) | unknown
    assert step.claim == NOTHING
    assert step.ack == case.view.generation


@PROPS
@given(cases(phases=[Phase.RUNNING]))
def test_a_new_generation_is_acked_and_a_handled_one_is_not(case: Case) -> None:
    step = run(case)
    assert step.ack == (case.view.generation if case.view.generation > case.handled else None)


@PROPS
@given(cases(protocols=[COOPERATIVE], phases=[Phase.RUNNING], unknown_in_target=False))
def test_cooperative_applied_plan_reaches_the_target_moving_only_what_it_must(
    case: Case,
) -> None:
    step = run(case)
    assert applied(case, step) == case.view.target
    kept = {r for r, e in case.held.items() if case.owned.get(r) == e}
    assert step.revoke.isdisjoint(kept & case.view.target)


@PROPS
@given(cases(phases=[Phase.RUNNING], unknown_in_target=False))
def test_every_protocol_reaches_the_target_while_running(case: Case) -> None:
    assert applied(case, run(case)) == case.view.target


@PROPS
@given(cases(phases=[Phase.RUNNING], unknown_in_target=False), st.integers(1, 9))
def test_once_the_plan_is_done_the_next_plan_is_empty(case: Case, epoch: int) -> None:
    step = run(case)
    now = {r: epoch if r in step.claim else case.held[r] for r in applied(case, step)}
    settled = MemberView(case.view.generation, Phase.RUNNING, case.view.target, dict(now))
    handled = case.handled if step.ack is None else step.ack
    again = plan(case.protocol, settled, now, handled)
    assert again == Plan(NOTHING, NOTHING, NOTHING, None, case.view.generation, settled=True)


@PROPS
@given(cases())
def test_a_plan_is_settled_exactly_when_the_store_agrees_and_nothing_is_to_be_done(
    case: Case,
) -> None:
    step = run(case)
    nothing = not (step.lost or step.revoke or step.claim) and step.ack is None
    assert step.settled == (dict(case.held) == dict(case.owned) and nothing)


@PROPS
@given(cases())
def test_a_view_read_without_the_claims_plans_as_if_the_store_held_what_the_member_holds(
    case: Case,
) -> None:
    # member_view(claims=False): the member knows its claims, so the plan is the one of a
    # view whose claims are exactly what it holds: nothing lost, nothing unknown.
    v = case.view
    without = MemberView(v.generation, v.phase, v.target, None, v.coordinator_epoch)
    agreeing = MemberView(v.generation, v.phase, v.target, dict(case.held), v.coordinator_epoch)
    step = plan(case.protocol, without, case.held, case.handled)
    assert step == plan(case.protocol, agreeing, case.held, case.handled)
    assert not step.lost
