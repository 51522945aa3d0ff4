"""The card is the digest (docs/design.md §5.2, §5.4): everything a card shows about a call — its
name, arguments, effect, its tool's description and MCP server, the preview — is covered by the
digest the card sends, and under the row lock that digest is recomputed from what would run: the
stored arguments and preview, each call's tool read from the run's gate now.

Each stored part of the pending turn is changed in turn by a direct database write, the way
someone who can write the table would, digest recomputed to match. A part the card reads from
the registry (effect, description, server) is never shown from the stored copy: the card shows
the truth and its digest binds it. A part the card shows from the stored turn (name, arguments,
preview) is shown, and its approval is refused because it is not what would run. Either way,
what runs is what the card showed, and a refused approval runs nothing.
"""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import reverse

from agentruns.exceptions import StaleTurn, UnreadableState
from agentruns.models import AgentRun, EventKind, McpServer, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import turn_digest
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest, waiting_for_approval
from tests.approvals.support.html import sentences
from tests.support.mcp_server import TicketServer
from tests.support.mcp_server import server_row as synced_row

DECIDE = "agentruns.decide_agentrun"
INBOX = reverse("approvals:inbox")
STALE = "The pending action changed — review again."
UNREADABLE = "This run's stored state cannot be read — nothing was changed."
DESCRIPTION = "Create a new note. Each call creates another note, even with the same text."
READ_BADGE = "<strong>Read</strong> <span>(changes nothing)</span>"
WRITE_BADGE = "<strong>Write</strong> <span>(non-idempotent: not safe to repeat)</span>"
TICKET = "mcp__tix__create_ticket"


@pytest.fixture
def reviewer(db):
    return UserFactory(username="reviewer", is_staff=True, permissions=[DECIDE])


def tamper(
    run: AgentRun, change: Callable[[dict[str, Any]], None], *, redigest: bool = True
) -> str:
    """Change the stored pending turn's first call by a direct UPDATE; with ``redigest`` the
    stored digest is recomputed to match (anyone who can write the table can). The stored
    digest afterwards."""
    turn = AgentRun.objects.values_list("pending_turn", flat=True).get(pk=run.pk)
    change(turn["calls"][0])
    if redigest:
        turn["turn_digest"] = turn_digest(turn["calls"])
    AgentRun.objects.filter(pk=run.pk).update(pending_turn=turn)
    return str(turn["turn_digest"])


def card(client: Any, run: AgentRun) -> tuple[str, str]:
    """The run's card in the inbox, as text, and the digest its form sends ("" without one)."""
    page = client.get(INBOX).content.decode()
    start = page.index(f'id="run-{run.uuid}"')
    article = page[start : page.index("</article>", start)]
    sent = re.search(r'name="turn_digest" value="([0-9a-f]*)"', article)
    return article, sent.group(1) if sent else ""


def approve(client: Any, run: AgentRun, digest: str) -> list[str]:
    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": digest},
        follow=True,
    )
    return sentences(response)


def assert_nothing_ran(run: AgentRun) -> None:
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL and run.pending_effect == ""
    assert not run.events.filter(kind__in=[EventKind.APPROVAL, EventKind.TOOL]).exists()
    assert not Note.objects.exists()


# --- What the card reads from the registry: shown as it is, bound by the digest -----------------


def effect_read(call: dict[str, Any]) -> None:
    call["effect"] = "read"


def harmless_description(call: dict[str, Any]) -> None:
    call["origin"]["description"] = "Reads the weather. Changes nothing."


def trusted_server(call: dict[str, Any]) -> None:
    call["origin"]["server"] = {
        "name": "trusted",
        "transport": "stdio",
        "endpoint": "/usr/bin/true",
        "enabled": True,
    }


def not_a_write(call: dict[str, Any]) -> None:
    call.update(needs_approval=False, known=False, source="mcp", hints={"readOnlyHint": True})


TOOL_FACTS = {
    "effect": effect_read,
    "description": harmless_description,
    "server": trusted_server,
    "known-and-source": not_a_write,
}


@pytest.mark.parametrize("change", TOOL_FACTS.values(), ids=TOOL_FACTS.keys())
def test_a_stored_tool_fact_changed_in_the_table_is_never_shown(client, reviewer, change):
    run = waiting_for_approval()
    client.force_login(reviewer)
    _, seen = card(client, run)
    forged = tamper(run, change)
    assert forged != seen

    shown, sent = card(client, run)

    # The card shows the tool as the registry has it, and sends the digest of that: the one the
    # reviewer saw before the table was written.
    assert WRITE_BADGE in shown and READ_BADGE not in shown
    assert DESCRIPTION in htmllib.unescape(shown)
    assert "Reads the weather" not in shown and "trusted" not in shown
    assert "Unknown tool" not in shown and "readOnlyHint" not in shown
    assert sent == seen == card_digest(run)
    # The forged digest matches no card: refused, nothing runs.
    assert approve(client, run, forged) == [STALE]
    with pytest.raises(StaleTurn):
        runs.run_decide(run_uuid=run.uuid, actor=reviewer, approved=True, turn_digest=forged)
    assert_nothing_ran(run)
    # The digest of what the card showed approves exactly that: a fenced non-idempotent write.
    approve(client, run, sent)
    runs.run_process_queued(run_uuid=run.uuid)  # the inbox hands the run to a worker
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    (tool,) = run.events.filter(kind=EventKind.TOOL)
    assert tool.payload["name"] == "create_note"
    assert tool.payload["effect"] == "non_idempotent_write"
    assert Note.objects.count() == 1


def test_the_reported_case_effect_read_without_a_new_digest_is_unreadable(client, reviewer):
    """The stored effect changed to ``read`` and the digest left as it was: the digest covers
    the effect, so the stored turn does not read — no card controls, no approval."""
    run = waiting_for_approval()
    client.force_login(reviewer)
    _, seen = card(client, run)
    tamper(run, effect_read, redigest=False)

    shown, sent = card(client, run)

    assert "cannot be read" in shown and sent == "" and READ_BADGE not in shown
    assert approve(client, run, seen) == [UNREADABLE]
    with pytest.raises(UnreadableState):
        runs.run_decide(run_uuid=run.uuid, actor=reviewer, approved=True, turn_digest=seen)
    assert_nothing_ran(run)


# --- What the card shows from the stored turn: shown, and refused when it is not what runs ------


def another_name(call: dict[str, Any]) -> None:
    call["name"] = "update_note"


def other_arguments(call: dict[str, Any]) -> None:
    call["arguments"] = {"title": "harmless", "body": "nothing to see"}


def another_preview(call: dict[str, Any]) -> None:
    call["preview"] = {"summary": "changes nothing at all", "target": None, "changes": []}


STORED_PARTS = {"name": another_name, "arguments": other_arguments, "preview": another_preview}


@pytest.mark.parametrize("change", STORED_PARTS.values(), ids=STORED_PARTS.keys())
def test_a_stored_call_changed_in_the_table_is_refused_whatever_digest_is_sent(
    client, reviewer, change
):
    run = waiting_for_approval()
    client.force_login(reviewer)
    _, seen = card(client, run)
    tamper(run, change)

    shown, sent = card(client, run)

    # The card shows the changed call, and a digest of exactly that...
    assert sent and sent != seen and sent == card_digest(run)
    assert "update_note" in shown or "harmless" in shown or "changes nothing at all" in shown
    # ...which is not what would run (the loop state's call, previewed when the run paused).
    assert approve(client, run, sent) == [UNREADABLE]
    with pytest.raises(UnreadableState, match="not the turn shown"):
        runs.run_decide(run_uuid=run.uuid, actor=reviewer, approved=True, turn_digest=sent)
    # The digest the reviewer saw before is no card's now.
    assert approve(client, run, seen) == [STALE]
    with pytest.raises(StaleTurn):
        runs.run_decide(run_uuid=run.uuid, actor=reviewer, approved=True, turn_digest=seen)
    assert_nothing_ran(run)


def test_an_untampered_card_approves_through_the_inbox_and_the_service(client, reviewer):
    run = waiting_for_approval()
    client.force_login(reviewer)
    shown, sent = card(client, run)
    assert WRITE_BADGE in shown and DESCRIPTION in htmllib.unescape(shown)
    assert sent == run.pending_turn["turn_digest"]  # nothing changed since it paused

    approve(client, run, sent)
    runs.run_process_queued(run_uuid=run.uuid)  # the inbox hands the run to a worker

    run.refresh_from_db()
    assert run.status == Status.COMPLETED and Note.objects.count() == 1
    other = waiting_for_approval(slug="notes-2")
    result = runs.run_decide(
        run_uuid=other.uuid, actor=reviewer, approved=True, turn_digest=card_digest(other)
    )
    assert result.run.status == Status.QUEUED


# --- A remote tool: its server row is read when the card is shown and when the call would run ----


def waiting_for_a_ticket() -> AgentRun:
    script = [{"tool_calls": [{"name": TICKET, "arguments": {"title": "printer on fire"}}]}]
    configuration = AgentConfigurationFactory(script=[*script, {"content": "filed"}])
    result = runs.run_start_sync(configuration=configuration, prompt="file it")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def new_description(row: McpServer) -> None:
    snapshot = list(row.tools_snapshot)
    snapshot[0] = {**snapshot[0], "description": "Reads the weather. Changes nothing."}
    McpServer.objects.filter(pk=row.pk).update(tools_snapshot=snapshot)


def new_endpoint(row: McpServer) -> None:
    McpServer.objects.filter(pk=row.pk).update(url="http://127.0.0.1:9/elsewhere/mcp")


SERVER_CHANGES = {"description": new_description, "endpoint": new_endpoint}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", SERVER_CHANGES.values(), ids=SERVER_CHANGES.keys())
def test_a_server_row_changed_after_the_card_was_shown_refuses_its_approval(
    mcp_server: TicketServer, client: Any, change: Callable[[McpServer], None]
) -> None:
    row = synced_row(mcp_server)
    run = waiting_for_a_ticket()
    reviewer = UserFactory(username="reviewer", is_staff=True, permissions=[DECIDE])
    client.force_login(reviewer)
    before, seen = card(client, run)
    assert mcp_server.url in before

    change(row)

    assert approve(client, run, seen) == [STALE]
    assert_nothing_ran(run)
    assert mcp_server.calls == []
    # The card shows the server row as it is now, with a new digest.
    after, sent = card(client, run)
    assert sent != seen and sent == card_digest(run)
    assert "Reads the weather" in after or "/elsewhere/mcp" in after


@pytest.mark.django_db(transaction=True)
def test_a_server_row_changed_after_the_approval_runs_nothing_and_asks_again(
    mcp_server: TicketServer, client: Any
) -> None:
    """The decision passed the lock's check; the server row then changes before a worker runs the
    call. The segment recomputes the digest from what it would run: nothing is called, a
    ``verification`` event says why, and a fresh card shows the server as it is now."""
    row = synced_row(mcp_server)
    run = waiting_for_a_ticket()
    reviewer = UserFactory(username="reviewer", is_staff=True, permissions=[DECIDE])
    seen = card_digest(run)
    queued = runs.run_decide(
        run_uuid=run.uuid, actor=reviewer, approved=True, turn_digest=seen, mode="queued"
    )
    assert queued.outcome == Outcome.QUEUED

    new_description(row)
    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.AWAITING_APPROVAL
    assert mcp_server.calls == []
    (check,) = run.events.filter(kind=EventKind.VERIFICATION)
    assert check.payload["decided_digest"] == seen
    run.refresh_from_db()
    assert run.pending_turn["calls"][0]["origin"]["description"].startswith("Reads the weather")
    assert card_digest(run) == run.pending_turn["turn_digest"] != seen
