"""A run pins the configuration version it started with (agentruns.versions,
docs/configuration-versions.md): an edit made between an approval and its continuation changes
nothing that runs; a new run uses the new version; what is about people (activity, groups)
stays live.

Real runs through the services, the scripted provider and the probe tools.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns import versions
from agentruns.exceptions import ConfigurationNotFound, SelfApprovalRefused, UnreadableState
from agentruns.models import AgentRun, ConfigurationVersion, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import read_pending_turn
from tests.agentruns.support.runtime import (
    PROBE_NAMES,
    call,
    config,
    decide_inline,
    decider,
    events,
    sent,
    snapshot,
    tool_turn,
)

pytestmark = pytest.mark.django_db

WRITE = call("probe_create", value="x")
PINNED_PROMPT = "You are the pinned agent."


def waiting_run(**fields: Any) -> tuple[AgentRun, Any]:
    """A run of a fresh configuration (version 1) waiting for approval of ``WRITE``."""
    fields.setdefault("script", [tool_turn(WRITE), {"content": "pinned answer"}])
    configuration = config(system_prompt=PINNED_PROMPT, **fields)
    started = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert started.outcome == Outcome.AWAITING_APPROVAL
    return AgentRun.objects.get(pk=started.run.pk), configuration


def edit_everything(configuration: Any) -> None:
    """An operator's edit of what governs execution: prompt, tools (the write removed), the
    script, the approval policy and the round cap."""
    configuration.system_prompt = "You are the EDITED agent."
    configuration.tools = [name for name in PROBE_NAMES if name != "probe_create"]
    configuration.script = [{"content": "edited answer"}]
    configuration.preview_is_snapshot = True
    configuration.max_iterations = 1
    configuration.save()


def system_prompts(run: AgentRun) -> set[str]:
    return {m["content"] for request in sent(run) for m in request if m.get("role") == "system"}


@pytest.mark.parametrize("mode", ["inline", "queued"])
def test_an_edit_between_the_approval_and_the_continuation_changes_nothing_that_runs(
    probes, scripted_recordings, mode
):
    run, configuration = waiting_run()
    assert run.config_version.number == 1
    pending = read_pending_turn(run)
    result = runs.run_decide(
        run_uuid=run.uuid,
        actor=decider(),
        approved=True,
        turn_digest=pending.turn_digest,
        mode=mode,
    )
    edit_everything(configuration)  # between the approval and the continuation
    assert configuration.versions.count() == 2
    if mode == "queued":
        assert result.run.status == Status.QUEUED
        result = runs.run_process_queued(run_uuid=run.uuid)
    assert result is not None and result.outcome == Outcome.COMPLETED

    done = AgentRun.objects.get(pk=run.pk)
    # The write approved ran (the edit removed its tool), under the pinned script and prompt.
    assert [seen["tool"] for seen in probes.seen] == ["probe_create"]
    assert done.output == "pinned answer"
    assert system_prompts(done) == {PINNED_PROMPT}
    assert done.config_version.number == 1

    later = runs.run_start_sync(configuration=configuration, prompt="after the edit").run
    assert later.config_version.number == 2
    assert later.output == "edited answer"
    assert system_prompts(later) == {"You are the EDITED agent."}


def test_the_card_and_its_digest_are_those_of_the_pinned_tools(probes):
    """An edit while the run waits (the write's tool removed) changes neither the card nor the
    digest: the decision binds what the pinned version runs."""
    run, configuration = waiting_run()
    shown = read_pending_turn(run).turn_digest
    edit_everything(configuration)
    from agentruns.tools.gate import ToolGate
    from agentruns.tools.shown import executing_digest, shown_turn

    fresh = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    gate = ToolGate.of(fresh)
    assert gate.available("probe_create") is not None
    pending = read_pending_turn(fresh)
    assert shown_turn(fresh, pending, gate=gate).turn_digest == shown
    assert executing_digest(fresh, pending, gate=gate) == shown
    assert decide_inline(fresh).outcome == Outcome.COMPLETED
    assert len(probes.seen) == 1


def test_a_deactivated_configuration_still_cancels_its_waiting_runs_and_refuses_decisions(
    probes, admin_client
):
    from django.urls import reverse

    run, configuration = waiting_run()
    other, _ = waiting_run()
    response = admin_client.post(
        reverse("admin:agentruns_agentconfiguration_changelist"),
        {"action": "deactivate_and_cancel_waiting", "_selected_action": [configuration.pk]},
    )
    assert response.status_code == 302
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert AgentRun.objects.get(pk=other.pk).status == Status.WAITING_FOR_APPROVAL
    # Activity is live, not versioned: a new run of it is refused although its version exists.
    with pytest.raises(ConfigurationNotFound):
        runs.run_start_sync(configuration=configuration.slug, prompt="again")
    assert probes.seen == []


def test_a_deactivation_by_update_refuses_the_decision_of_a_pinned_run(probes):
    run, configuration = waiting_run()
    type(configuration).objects.filter(pk=configuration.pk).update(is_active=False)
    before = snapshot(run)
    with pytest.raises(UnreadableState):
        decide_inline(run)
    assert snapshot(run) == before and probes.seen == []


def test_four_eyes_switched_on_after_the_start_reaches_the_waiting_run(probes):
    """How people may decide takes the stricter of pinned and live: four-eyes switched on
    while the run waits refuses its initiator's approval."""
    initiator = decider()
    configuration = config(script=[tool_turn(WRITE), {"content": "ok"}])
    run = runs.run_start_sync(configuration=configuration, prompt="x", initiator=initiator).run
    configuration.require_second_approver = True
    configuration.save()
    with pytest.raises(SelfApprovalRefused):
        decide_inline(AgentRun.objects.get(pk=run.pk), actor=initiator)
    assert probes.seen == []


def test_an_unreadable_version_is_refused_not_run(probes):
    """A version row changed by hand (hostile or broken JSON) is never guessed at: the decision
    is refused and nothing runs."""
    run, _ = waiting_run()
    ConfigurationVersion.objects.filter(pk=run.config_version_id).update(
        snapshot={"tools": "<script>alert(1)</script>"}
    )
    versions.forget_all()
    before = snapshot(run)
    with pytest.raises(UnreadableState):
        decide_inline(run)
    assert snapshot(run) == before and probes.seen == []


def test_a_segment_reads_no_version_row_once_the_process_has_it(probes):
    """Versions are immutable and cached by id: after a process read one, a continuation (the
    decision and its segment) reads no version row; a cold process reads it once."""
    run, _ = waiting_run(script=[tool_turn(WRITE), tool_turn(WRITE), {"content": "ok"}])
    versions.forget_all()
    with CaptureQueriesContext(connection) as cold:
        assert decide_inline(run).outcome == Outcome.AWAITING_APPROVAL
    with CaptureQueriesContext(connection) as warm:
        assert decide_inline(AgentRun.objects.get(pk=run.pk)).outcome == Outcome.COMPLETED
    table = ConfigurationVersion._meta.db_table

    def reads(queries: Any) -> int:
        return sum(
            1 for q in queries.captured_queries if table in q["sql"] and "SELECT" in q["sql"]
        )

    assert reads(cold) == 1
    assert reads(warm) == 0


def test_the_timeline_and_the_inbox_name_the_version(probes, client):
    from django.urls import reverse

    run, configuration = waiting_run()
    configuration.system_prompt = "changed"
    configuration.save()
    staff = decider(is_staff=True, username="viewer")
    staff.user_permissions.add(*_view_all())
    client.force_login(staff)
    inbox = client.get(reverse("approvals:inbox")).content.decode()
    assert "v1" in inbox
    page = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "v1" in page and "pinned when the run started" in page
    assert events(run)[0].kind == EventKind.LEASE


def _view_all() -> list[Any]:
    from django.contrib.auth.models import Permission

    return list(Permission.objects.filter(codename="view_all_agentruns"))


def test_the_api_names_the_version_the_run_pinned(probes):
    from tests.agentruns.support.api import client_for

    run, configuration = waiting_run()
    configuration.system_prompt = "changed"
    configuration.save()
    later = runs.run_start_sync(configuration=configuration, prompt="later").run
    api = client_for(decider(username="api-reader"))
    assert api.get(f"/api/runs/{run.uuid}/").json()["configuration_version"] == 1
    assert api.get(f"/api/runs/{later.uuid}/").json()["configuration_version"] == 2
