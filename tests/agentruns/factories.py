"""Factories for the run domain, with traits for each state."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from agentruns.leases import Lease
from agentruns.models import AgentConfiguration, AgentRun, Effect, Provider, Status
from agentruns.tools.gate import ToolGate
from agentruns.turns import Call, LoopState, PendingTurn, Turn, turn_digest

HOLDER = "worker:test-host:1"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.com")
    password = factory.django.Password("pw")
    is_staff = True

    @factory.post_generation
    def permissions(self, create: bool, extracted: list[str] | None, **kwargs) -> None:
        if not create or not extracted:
            return
        for codename in extracted:
            app_label, code = codename.split(".")
            self.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=code)
            )


# The gate of a configuration that allows every tool: how a card shows a call (its tool read
# from the registry; the local tools here need no query).
EVERY_TOOL = ToolGate(allowed=None, narrowed=None)
# The pending turns of the waiting traits, built as the runtime builds them: each call as the
# card shows it, so the stored digest is the one the card sends.
WAITING_TURN = PendingTurn.for_approval(
    [
        EVERY_TOOL.shown(
            Call(id="call_0_0", name="create_note", arguments={"title": "t", "body": "b"})
        )
    ]
)
INPUT_TURN = PendingTurn.for_input(
    EVERY_TOOL.shown(Call(id="call_0_0", name="ask_user", arguments={})), {"type": "object"}
)
IN_DOUBT_CALL = EVERY_TOOL.shown(
    Call(id="call_0_0", name="create_note", arguments={"title": "t"}),
    effect=Effect.NON_IDEMPOTENT_WRITE,
)
IN_DOUBT_TURN = PendingTurn(
    kind="reconciliation", turn_digest=turn_digest([IN_DOUBT_CALL]), calls=(IN_DOUBT_CALL,)
)
# The loop states those traits leave: the turn the next segment executes (what a decision binds).
WAITING_STATE = LoopState(iteration=1, turn=Turn(calls=list(WAITING_TURN.calls)))
INPUT_STATE = LoopState(iteration=1, turn=Turn(calls=list(INPUT_TURN.calls)))
WAITING_DIGEST = WAITING_TURN.turn_digest
INPUT_DIGEST = INPUT_TURN.turn_digest
IN_DOUBT_DIGEST = IN_DOUBT_TURN.turn_digest


class AgentConfigurationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AgentConfiguration
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"config-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())
    provider = Provider.SCRIPTED
    script = factory.LazyFunction(lambda: [{"content": "done"}])


class AgentRunFactory(factory.django.DjangoModelFactory):
    """A bare run row in a chosen state (tests of transitions; the runtime makes real ones)."""

    class Meta:
        model = AgentRun

    configuration = factory.SubFactory(AgentConfigurationFactory)
    prompt = "hello"
    status = Status.QUEUED

    class Params:
        running = factory.Trait(
            status=Status.RUNNING,
            claimed_by=HOLDER,
            lease_epoch=1,
            lease_expires=factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=60)),
            started_at=factory.LazyFunction(timezone.now),
        )
        stale = factory.Trait(
            running=True,
            lease_expires=factory.LazyFunction(lambda: timezone.now() - timedelta(minutes=5)),
        )
        fenced = factory.Trait(
            pending_effect=Effect.NON_IDEMPOTENT_WRITE,
            pending_call=factory.LazyFunction(
                lambda: {"id": "call_0_0", "name": "create_note", "arguments": {"title": "t"}}
            ),
        )
        waiting = factory.Trait(
            status=Status.WAITING_FOR_APPROVAL,
            lease_epoch=1,
            pending_turn=factory.LazyFunction(lambda: WAITING_TURN.to_json()),
            loop_state=factory.LazyFunction(lambda: WAITING_STATE.to_json()),
        )
        waiting_for_input = factory.Trait(
            status=Status.WAITING_FOR_INPUT,
            lease_epoch=1,
            pending_turn=factory.LazyFunction(lambda: INPUT_TURN.to_json()),
            loop_state=factory.LazyFunction(lambda: INPUT_STATE.to_json()),
        )
        in_doubt = factory.Trait(
            status=Status.WAITING_FOR_RECONCILIATION,
            lease_epoch=1,
            fenced=True,
            pending_turn=factory.LazyFunction(lambda: IN_DOUBT_TURN.to_json()),
        )
        completed = factory.Trait(status=Status.COMPLETED, termination_reason="completed")
        failed = factory.Trait(status=Status.FAILED, termination_reason="provider_failed")
        cancelled = factory.Trait(status=Status.CANCELLED, termination_reason="cancelled")


def lease_for(run: AgentRun, *, next_sequence: int = 0) -> Lease:
    """The lease a segment holding ``run`` (as the row names it now) would carry."""
    return Lease(run.pk, run.uuid, run.claimed_by, run.lease_epoch, next_sequence=next_sequence)
