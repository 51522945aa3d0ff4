"""A notes assistant on the OpenAI Agents SDK, under Leasehold's lease, fence, inbox and ledger.

    .venv/bin/python examples/openai_agents_notes.py

The agent is plain Agents SDK code (``Agent``, ``@function_tool``, ``Runner`` inside
``openai_agents.run``) with a scripted model: no network, no API key. The story:

1. the assistant proposes to save a note; ``save_note`` is a non-idempotent write, so the SDK's
   ``needs_approval`` is answered by Leasehold: the run waits in the inbox, its ``RunState``
   stored with it;
2. a person approves it in the inbox (the real inbox view, through Django's test client);
3. a worker process resumes the run and is killed (SIGKILL) in the middle of the write: the note
   is in the table, the process never said so;
4. its lease runs out and the reaper finds the write's fence: the run waits for reconciliation,
   never retried; the person looks the idempotency key up, sees the note, and says "landed";
5. a worker resumes the stored state again: the write is returned as recorded — not run again —
   and the model finishes. One note, and a ledger that verifies.

It uses a fresh SQLite database in a temporary directory (``DATABASE_URL`` to use another) and a
2-second lease so the reaper notices the killed worker quickly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if "DATABASE_URL" not in os.environ:
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='notes-')}/notes.sqlite3"
os.environ.setdefault("AGENTRUNS_LEASE_SECONDS", "2")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

import django  # noqa: E402

django.setup()

from agents import Agent, function_tool, set_tracing_disabled  # noqa: E402
from django.contrib.auth.models import Permission, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

from agentruns.audit import verify  # noqa: E402
from agentruns.event_summaries import summarise  # noqa: E402
from agentruns.external import openai_agents  # noqa: E402
from agentruns.external.openai_agents.scripted import ScriptedTurns, call, say  # noqa: E402
from agentruns.models import AgentConfiguration, AgentRun, Effect  # noqa: E402
from agentruns.services import reaper  # noqa: E402
from playground.models import Note  # noqa: E402

set_tracing_disabled(True)  # the SDK's tracing would send the run to OpenAI: keep it local

DIE_MID_WRITE = "NOTES_EXAMPLE_DIE_MID_WRITE"


@function_tool
def save_note(title: str, body: str) -> str:
    """Save a note with a title and a body."""
    key = openai_agents.call_context().idempotency_key  # <run uuid>:<call id>
    note = Note.objects.create(title=title, body=body, idempotency_key=key)
    if os.environ.get(DIE_MID_WRITE):
        os.kill(os.getpid(), signal.SIGKILL)  # the note landed; nobody will hear of it
    return f"saved note {note.pk}: {title}"


@function_tool
def count_notes() -> str:
    """How many notes there are."""
    return str(Note.objects.count())


TOOLS = [
    openai_agents.leasehold_tool(save_note, effect=Effect.NON_IDEMPOTENT_WRITE),
    openai_agents.leasehold_tool(count_notes, effect=Effect.READ),
]

MODEL = ScriptedTurns(
    [
        [call("count_notes", {}, call_id="call_count")],
        [call("save_note", {"title": "Plumber", "body": "Tuesday, 9am"}, call_id="call_save")],
        lambda outputs: [say(f"Done. The notes tool said: {outputs['call_save']}")],
    ]
)
AGENT = Agent(name="notes", instructions="You keep notes.", tools=TOOLS, model=MODEL)


def worker() -> None:
    """A worker process: resume every queued run of the notes agent."""
    for result in openai_agents.resume_all([AGENT]):
        print(f"  worker: run {result.run_uuid[:8]} is {result.outcome}")


def setup() -> tuple[AgentConfiguration, User, User]:
    call_command("migrate", verbosity=0)
    configuration, _ = AgentConfiguration.objects.get_or_create(
        slug="notes-assistant",
        defaults={"name": "Notes assistant", "tools": ["save_note", "count_notes"]},
    )
    sam, _ = User.objects.get_or_create(username="sam")
    ada, _ = User.objects.get_or_create(username="ada", defaults={"is_staff": True})
    ada.user_permissions.add(Permission.objects.get(codename="decide_agentrun"))
    return configuration, sam, ada


def inbox_digest(client: Client, run_uuid: str) -> str:
    """The digest on the run's card, as the inbox shows it."""
    page = client.get(reverse("approvals:run", kwargs={"run_uuid": run_uuid}))
    assert page.status_code == 200, page.status_code
    found = re.search(r'name="turn_digest"\s+value="([0-9a-f]{64})"', page.content.decode())
    assert found, "no card on the run's page"
    return found.group(1)


def in_the_inbox(client: Client, run_uuid: str, action: str, **fields: str) -> None:
    url = reverse(f"approvals:{action}", kwargs={"run_uuid": run_uuid})
    answer = client.post(url, {"turn_digest": inbox_digest(client, run_uuid), **fields})
    assert answer.status_code == 302, answer.status_code


def spawn_worker(*, die_mid_write: bool) -> int:
    env = {**os.environ, DIE_MID_WRITE: "1" if die_mid_write else ""}
    return subprocess.run([sys.executable, __file__, "worker"], env=env, check=False).returncode


def main() -> None:
    configuration, sam, ada = setup()
    inbox = Client(SERVER_NAME="localhost")
    inbox.force_login(ada)

    print("1. Sam asks; the assistant counts the notes (a read: it passes) and wants to save one")
    started = openai_agents.start(
        AGENT,
        prompt="Remind me the plumber comes Tuesday",
        configuration=configuration,
        initiator=sam,
    )
    run_uuid = started.run_uuid
    assert started.outcome == openai_agents.WAITING and started.card is not None
    for shown in started.card.calls:
        print(f"   waiting in the inbox: {shown['name']}({shown['arguments']}) [{shown['effect']}]")

    print("2. Ada approves it in the inbox")
    in_the_inbox(inbox, run_uuid, "decide", decision="approve")

    print("3. A worker resumes the run and is killed in the middle of the write")
    code = spawn_worker(die_mid_write=True)
    print(f"   worker exit code {code}; notes in the table: {Note.objects.count()}")

    print("4. Its lease runs out; the reaper finds the write's fence")
    time.sleep(float(os.environ["AGENTRUNS_LEASE_SECONDS"]) + 0.5)
    for verdict in reaper.reap_stale_runs().verdicts:
        print(f"   reaper: {verdict.verdict} ({verdict.rule})")
    row = AgentRun.objects.get(uuid=run_uuid)
    key = row.pending_turn["idempotency_key"]
    print(f"   the run is {row.status}; the card names the idempotency key {key}")
    landed = Note.objects.filter(idempotency_key=key).exists()
    print(f"   Ada looks the key up: a note carries it ({landed}); she says it landed")
    in_the_inbox(inbox, run_uuid, "reconcile", verdict="landed" if landed else "not_landed")

    print("5. A worker resumes the stored state; the write is returned as recorded")
    code = spawn_worker(die_mid_write=False)
    row = AgentRun.objects.get(uuid=run_uuid)
    print(f"   the run is {row.status}: {row.output!r}")
    print(f"   notes with the key: {Note.objects.filter(idempotency_key=key).count()}")
    print("   the timeline:")
    for event in row.events.order_by("sequence"):
        print(f"     {event.sequence:2} {event.kind:15} {summarise(event.kind, event.payload)}")
    report = verify(run_uuid=row.uuid)
    print(f"   the ledger: {report.summary()}")
    assert row.status == "completed" and Note.objects.count() == 1 and not report.broken


if __name__ == "__main__":
    worker() if sys.argv[1:] == ["worker"] else main()
