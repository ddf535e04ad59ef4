"""The one rulebook: which controller call an input event becomes, and when it is refused.

Every input topic is keyed by scope (DESIGN, data flow), and the key decides which process owns
the event. Live (``streams.agents.control``), in offline replay and in the fleet simulator
(``streams.replay.ControlDriver``), an event goes through the same steps, written only here:

1. its scope is read from the value (``Rule.scope``): the ``region`` of a WindowReport, a
   CapacityEvent or a PreemptionNotice, the ``scope`` of a RoutingOutcome, an OutcomeLabel or
   an OperatorOverride;
2. the message key must equal that scope (a single label's may be its request id instead; a
   batch of labels is keyed by their scope, and labels are written to their scope's
   partition), or the event is refused as ``key_mismatch``;
3. the scope's controller takes it (``Rule.apply``: ``on_report``, ``on_capacity``,
   ``on_preemption``, ``on_outcome``, ``on_label``, ``on_override``). A controller that
   refuses it (unlike
   sketches, too many pools, another scope: ``REFUSALS``) refuses the event, the exception's
   class name its reason;
4. with a keyring (live only), a message of a topic whose issuers sign (``Rule.signed``:
   capacity, preemption, overrides) is refused unless it verifies (``authenticate``:
   ``unsigned``, ``unknown_key``, ``bad_signature``), before any controller sees it;
5. a preemption or an operator's kill gives targets to publish at once (``Rule.publishes``:
   the fast path); capacity, preemption and overrides change state that must survive a
   restart (``Rule.durable``), which an agent persists before it publishes what they produced.

``targets`` is the control plane's own output: a log may hold targets recorded from a live
plane, but they never reach a controller (``rule_for`` gives None). Any other topic is refused
as ``unknown_topic``. A refusal is a ``Rejected`` with a short ``reason`` (what replay counts and
the live rejected metric is labelled with) and a ``detail`` (the dead letter's text).

Decoding stays at the edges: the agents decode wire bytes, the event log decodes lines; both
hand the rulebook contract values. Replay calls ``dispatch`` 200,000+ times a second, so the
common case is one key comparison and three calls (the scope getter, ``controller_for``, the
controller's method).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    OperatorOverride,
    OutcomeLabel,
    PreemptionNotice,
    RoutingOutcome,
    WindowReport,
)
from schemas.sketch import SketchMismatch
from streams.control.controller import ScopeController, ScopeMismatch
from streams.control.windows import TooManyPools

KEY_MISMATCH = "key_mismatch"
UNKNOWN_TOPIC = "unknown_topic"
REFUSALS: tuple[type[Exception], ...] = (SketchMismatch, TooManyPools, ScopeMismatch)
"""What a controller raises when it refuses an event (the event is bad, not the controller)."""
RECORDED = frozenset({"targets", "estimates"})
"""Topics a log may hold that are output, never input: passed by, not dispatched."""

ControllerFor = Callable[[str], ScopeController]
"""The scope's controller, created on first use (the caller owns the controllers)."""


class Rejected(ValueError):
    """An event refused: ``reason`` is short and stable, ``detail`` says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Rule:
    """How the events of one input topic reach a controller."""

    topic: str
    value_type: type[Event]
    scope: Callable[[Any], str]
    apply: Callable[[ScopeController, Any, int], ControlTargets | None]
    publishes: bool
    """``apply`` returns targets to publish now (not at the next tick)."""
    durable: bool
    """The event changes state that must survive a restart: persist it before publishing."""
    key: Callable[[Any], str] | None = None
    """What the message key may equal besides the scope (a single label's request id)."""
    signed: bool = False
    """Its issuers sign it (`schemas.signing`): with a keyring, only what verifies is taken."""


RULES: dict[str, Rule] = {rule.topic: rule for rule in (
    Rule("telemetry", WindowReport, attrgetter("region"), ScopeController.on_report,
         publishes=False, durable=False),
    Rule("capacity", CapacityEvent, attrgetter("region"), ScopeController.on_capacity,
         publishes=False, durable=True, signed=True),
    Rule("preemption", PreemptionNotice, attrgetter("region"), ScopeController.on_preemption,
         publishes=True, durable=True, signed=True),
    Rule("outcomes", RoutingOutcome, attrgetter("scope"), ScopeController.on_outcome,
         publishes=False, durable=False),
    Rule("overrides", OperatorOverride, attrgetter("scope"), ScopeController.on_override,
         publishes=True, durable=True, signed=True),
    Rule("labels", OutcomeLabel, attrgetter("scope"), ScopeController.on_label,
         publishes=False, durable=False, key=attrgetter("request_id")),
)}
INPUTS: tuple[str, ...] = tuple(RULES)


def rule_for(topic: str) -> Rule | None:
    """The rule of an input topic; None for recorded output; ``Rejected`` for anything else."""
    rule = RULES.get(topic)
    if rule is None and topic not in RECORDED:
        raise Rejected(UNKNOWN_TOPIC, f"topic {topic!r} is not an input of the control plane")
    return rule


def key_mismatch(key: str | None, scope: str, what: str = "scope") -> Rejected:
    return Rejected(KEY_MISMATCH, f"message key {key!r} does not match {what} {scope!r}")


def _mismatch(rule: Rule, key: str | None, value: Any, scope: str) -> Rejected:
    if rule.key is None:
        return key_mismatch(key, scope)
    return Rejected(KEY_MISMATCH, f"message key {key!r} is neither the request id "
                                  f"{rule.key(value)!r} nor the scope {scope!r} (a batch's key "
                                  f"is its scope)")


def refused(exc: Exception) -> Rejected:
    """The refusal a controller's exception (one of ``REFUSALS``) stands for."""
    return Rejected(type(exc).__name__, str(exc))


def authenticate(rule: Rule, values: Sequence[Any],
                 check: Callable[[Any], str | None] | None) -> None:
    """Refuse the message unless every value verifies (``check``: `Keyring.check`, giving the
    refusal reason or None); nothing to do for a topic nobody signs or without a keyring."""
    if check is None or not rule.signed:
        return
    for value in values:
        refusal = check(value)
        if refusal is not None:
            key_id = getattr(value, "key_id", None)
            named = key_id if isinstance(key_id, str) else "none"
            raise Rejected(refusal, f"{type(value).__name__}: {refusal} (key id {named})")


def dispatch(rule: Rule, key: str | None, value: Any, controller_for: ControllerFor,
             now_ms: int) -> ControlTargets | None:
    """Hand one event to its scope's controller; targets to publish now, or None."""
    scope = rule.scope(value)
    if key != scope and (rule.key is None or key != rule.key(value)):
        raise _mismatch(rule, key, value, scope)
    controller = controller_for(scope)
    try:
        return rule.apply(controller, value, now_ms)
    except REFUSALS as exc:
        raise refused(exc) from exc


def dispatch_all(rule: Rule, key: str | None, values: Sequence[Any],
                 controller_for: ControllerFor, now_ms: int) -> list[ControlTargets]:
    """One message of several values (a telemetry batch): refused whole if any key lies, else
    each in turn (a refusal stops at that value); the targets to publish now, in order."""
    for value in values:
        scope = rule.scope(value)
        if key != scope and (rule.key is None or len(values) > 1 or key != rule.key(value)):
            raise _mismatch(rule, key, value, scope)
    if not values:
        return []
    controller = controller_for(rule.scope(values[0]))
    published: list[ControlTargets] = []
    try:
        for value in values:
            targets = rule.apply(controller, value, now_ms)
            if targets is not None:
                published.append(targets)
    except REFUSALS as exc:
        raise refused(exc) from exc
    return published
