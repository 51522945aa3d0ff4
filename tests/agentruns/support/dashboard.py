"""History for the dashboard's tests: events and ended runs at chosen times, in bulk."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    ApprovalRule,
    ApprovalRuleEvent,
    EventKind,
    RuleEventKind,
    SpendDay,
    SpendScope,
    Status,
)
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory


def at(event: AgentRunEvent, when: datetime) -> None:
    AgentRunEvent.objects.filter(pk=event.pk).update(created_at=when)


def event(run: AgentRun, sequence: int, kind: str, when: datetime, **payload) -> AgentRunEvent:
    made = AgentRunEvent.objects.create(run=run, sequence=sequence, kind=kind, payload=payload)
    at(made, when)
    return made


def finished(status: str, when: datetime, **kwargs) -> AgentRun:
    run = AgentRunFactory(status=status, **kwargs)
    AgentRun.objects.filter(pk=run.pk).update(finished_at=when)
    return run


def history(size: int) -> None:
    """``size`` ended runs in the last day, each with an answer, an approval and a reaper event,
    and as many waiting runs: every chart has rows to read."""
    configuration = AgentConfigurationFactory()
    now = timezone.now()
    made = AgentRun.objects.bulk_create(
        AgentRun(
            configuration=configuration,
            prompt="p",
            status=(Status.COMPLETED, Status.FAILED, Status.WAITING_FOR_APPROVAL)[n % 3],
            finished_at=now - timedelta(minutes=n % 1400),
        )
        for n in range(size)
    )
    AgentRunEvent.objects.bulk_create(
        AgentRunEvent(run=run, sequence=seq, kind=kind, payload={"verdict": "requeued"})
        for run in made
        for seq, kind in enumerate((EventKind.LLM, EventKind.APPROVAL, EventKind.REAPER))
    )
    auto_approvals(configuration, size)
    today = now.astimezone(UTC).date()
    SpendDay.objects.bulk_create(
        SpendDay(
            day=today - timedelta(days=n), scope=SpendScope.CONFIGURATION, key=configuration.pk
        )
        for n in range(min(size, 30))
    )


def auto_approvals(configuration: AgentConfiguration, size: int) -> None:
    """``size`` turns approved by up to twelve standing approvals (``used`` rule events)."""
    if not size:
        return
    author = UserFactory()
    rules = [
        ApprovalRule.objects.create(
            configuration=configuration,
            tool=f"tool_{n}",
            arguments_schema={},
            author=author,
            expires_at=timezone.now() + timedelta(days=1),
        )
        for n in range(min(size, 12))
    ]
    ApprovalRuleEvent.objects.bulk_create(
        ApprovalRuleEvent(rule=rules[n % len(rules)], kind=RuleEventKind.USED, calls=1 + n % 2)
        for n in range(size)
    )


def varied_history(seed: int = 14) -> None:
    """A plausible fortnight for every chart (the browser test, the README's screenshot): ended
    runs in each of the last 24 hours, approval decisions with waits of a few minutes to hours on
    each of the last 14 days, reaper verdicts on some days, and runs waiting now at every age."""
    rnd = random.Random(seed)
    configuration = AgentConfigurationFactory(slug="dashboard-demo", name="Dashboard demo")
    now = timezone.now()
    ended = [
        (status, now - timedelta(hours=hour, minutes=rnd.randrange(60)))
        for hour in range(24)
        for status, most in ((Status.COMPLETED, 12), (Status.FAILED, 3), (Status.CANCELLED, 2))
        for _ in range(
            rnd.randrange(most + 1) if status != Status.COMPLETED else 2 + rnd.randrange(most)
        )
    ]
    AgentRun.objects.bulk_create(
        AgentRun(configuration=configuration, prompt="p", status=s, finished_at=when)
        for s, when in ended
    )
    stamped: list[tuple[AgentRun, list[tuple[str, datetime, dict]]]] = []
    for day in range(14):
        for _ in range(3 + rnd.randrange(8)):
            asked = now - timedelta(days=day, hours=rnd.uniform(1, 20))
            wait = timedelta(minutes=min(rnd.expovariate(1 / (6 + day % 4 * 5)), 600))
            stamped.append(
                (
                    AgentRun(configuration=configuration, prompt="p", status=Status.COMPLETED),
                    [
                        (EventKind.LLM, asked, {}),
                        (EventKind.APPROVAL, min(asked + wait, now), {"approved": True}),
                    ],
                )
            )
        for verdict, most in (("requeued", 6), ("dead_lettered", 2), ("in_doubt", 1)):
            for _ in range(rnd.randrange(most + 1)):
                when = now - timedelta(days=day, hours=rnd.uniform(0, 20))
                stamped.append(
                    (
                        AgentRun(configuration=configuration, prompt="p", status=Status.QUEUED),
                        [(EventKind.REAPER, when, {"rule": "reclaim", "verdict": verdict})],
                    )
                )
    AgentRun.objects.bulk_create(run for run, _ in stamped)
    for run, events in stamped:
        for sequence, (kind, when, payload) in enumerate(events):
            event(run, sequence, kind, when, **payload)
    for trait, ages in (
        ("waiting", (2, 3, 20, 45, 180, 3000)),
        ("waiting_for_input", (1, 70)),
        ("in_doubt", (30, 2900)),
    ):
        for minutes in ages:
            run = AgentRunFactory(configuration=configuration, **{trait: True})
            AgentRun.objects.filter(pk=run.pk).update(
                updated_at=Now() - Value(timedelta(minutes=minutes))
            )
    today = now.astimezone(UTC).date()
    spenders = [
        configuration,
        AgentConfigurationFactory(slug="dashboard-support", name="Support desk"),
        AgentConfigurationFactory(slug="dashboard-research", name="Research assistant"),
    ]
    SpendDay.objects.bulk_create(
        SpendDay(
            day=today - timedelta(days=day),
            scope=SpendScope.CONFIGURATION,
            key=spender.pk,
            amount=Decimal(round(rnd.uniform(0.2, 4.0) * (n + 1), 6)).quantize(Decimal("0.000001")),
            calls=rnd.randrange(10, 200),
        )
        for day in range(14)
        for n, spender in enumerate(spenders)
    )
    auto_approvals(configuration, 18)
