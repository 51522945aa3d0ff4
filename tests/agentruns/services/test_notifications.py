"""Notifications (issue 14 §2): who is told, how often, what the digest says, and that a failure
is logged and counted and never touches a run. Email through Django's locmem backend and a real
SMTP server (aiosmtpd); webhooks against real local HTTP servers."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client, override_settings

from agentruns.metrics import counter_add
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    Counter,
    Effect,
    NotificationState,
    Status,
)
from agentruns.notification_text import card_link
from agentruns.services import schedules
from agentruns.services.notifications import notifications_send
from agentruns.tasks import notify_waiting
from agentruns.turns import Call, PendingTurn
from tests.agentruns.factories import (
    IN_DOUBT_TURN,
    AgentConfigurationFactory,
    AgentRunFactory,
    UserFactory,
)
from tests.support.smtp_server import free_port

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
WEBHOOKS = "playground.approve_webhooks"
SITE = "http://testserver"


def agentruns(**values):
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE, **values})


def notify(**values):
    with agentruns(**values):
        return notifications_send()


def interval_passes() -> None:
    NotificationState.objects.update(last_sent_at=Now() - Value(timedelta(seconds=301)))


def webhook_run(configuration=None) -> AgentRun:
    turn = PendingTurn.for_approval(
        [
            Call(
                id="call_0_0",
                name="call_webhook",
                arguments={"url": "http://hooks.example/x", "payload": {}},
                effect=Effect.NON_IDEMPOTENT_WRITE,
            )
        ]
    )
    return AgentRunFactory(
        configuration=configuration or AgentConfigurationFactory(),
        status=Status.WAITING_FOR_APPROVAL,
        lease_epoch=1,
        pending_turn=turn.to_json(),
    )


def input_run(configuration=None, *, name: str = "ask_human") -> AgentRun:
    turn = PendingTurn.for_input(
        Call(id="call_0_0", name=name, arguments={"question": "q"}, effect=Effect.READ),
        {"type": "object"},
    )
    return AgentRunFactory(
        configuration=configuration or AgentConfigurationFactory(),
        status=Status.WAITING_FOR_INPUT,
        lease_epoch=1,
        pending_turn=turn.to_json(),
    )


def told(address: str) -> list[mail.EmailMessage]:
    return [message for message in mail.outbox if message.to == [address]]


def uuids_in(message: mail.EmailMessage, runs: list[AgentRun]) -> set:
    return {run.uuid for run in runs if str(run.uuid) in message.body}


def row(run: AgentRun) -> tuple:
    fresh = AgentRun.objects.get(pk=run.pk)
    return (fresh.status, fresh.updated_at, fresh.lease_epoch, fresh.events.count())


# --- Who is told ---------------------------------------------------------------------------------


def test_a_digest_goes_to_each_person_who_may_decide_and_to_nobody_else():
    alice = UserFactory(username="alice", permissions=[DECIDE])
    UserFactory(username="no-email", email="", permissions=[DECIDE])
    UserFactory(username="not-staff", is_staff=False, permissions=[DECIDE])
    UserFactory(username="inactive", is_active=False, permissions=[DECIDE])
    UserFactory(username="viewer", permissions=["agentruns.view_all_agentruns"])
    root = UserFactory(username="root", is_superuser=True)
    approval = AgentRunFactory(waiting=True)
    asking = input_run()

    report = notify()

    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.com", "root@example.com"]
    for person in (alice, root):
        (message,) = told(person.email)
        assert message.subject == "Leasehold: 2 runs wait for you"
        assert uuids_in(message, [approval, asking]) == {approval.uuid, asking.uuid}
        assert f"{SITE}/admin/approvals/runs/{approval.uuid}/" in message.body
        assert "approval of create_note (non-idempotent write)" in message.body
        assert "input for ask_human" in message.body
    assert report.sent == {"email": 2} and report.waiting == 2


def test_tool_authority_and_the_approver_group_decide_who_hears_of_a_run():
    approvers = Group.objects.create(name="approvers")
    guarded = AgentConfigurationFactory(approver_group=approvers)
    hook = webhook_run()  # approving call_webhook needs playground.approve_webhooks
    grouped = AgentRunFactory(configuration=guarded, waiting=True)  # needs the group
    doubt = AgentRunFactory(configuration=guarded, in_doubt=True)  # landed/not landed: the group
    asking = input_run(guarded)  # input needs decide_agentrun only
    runs = [hook, grouped, doubt, asking]
    frank = UserFactory(username="frank", permissions=[DECIDE])
    gina = UserFactory(username="gina", permissions=[DECIDE, WEBHOOKS])
    hank = UserFactory(username="hank", permissions=[DECIDE])
    hank.groups.add(approvers)
    root = UserFactory(username="root", is_superuser=True)  # every permission, but no group
    assert IN_DOUBT_TURN.kind == "reconciliation"

    notify()

    expected = {
        frank: {asking.uuid},
        gina: {hook.uuid, asking.uuid},
        hank: {grouped.uuid, doubt.uuid, asking.uuid},
        root: {hook.uuid, asking.uuid},
    }
    for person, uuids in expected.items():
        (message,) = told(person.email)
        assert uuids_in(message, runs) == uuids, person.username
        # Every link opens, for this person, the card of a run they may decide.
        client = Client()
        client.force_login(person)
        for run in runs:
            if run.uuid in uuids:
                page = client.get(card_link(run).removeprefix(SITE))
                assert page.status_code == 200 and str(run.uuid) in page.content.decode()


# --- How often -----------------------------------------------------------------------------------


def test_at_most_one_digest_per_interval_and_only_what_was_not_told():
    alice = UserFactory(username="alice", permissions=[DECIDE])
    first = AgentRunFactory(waiting=True)
    notify()
    notify()  # nothing new: nothing sent
    assert len(told(alice.email)) == 1

    second = input_run()
    report = notify()  # news, but the interval has not passed
    assert len(told(alice.email)) == 1 and report.deferred == 1

    interval_passes()
    notify()
    latest = told(alice.email)[-1]
    assert len(told(alice.email)) == 2
    assert uuids_in(latest, [first, second]) == {second.uuid}
    assert latest.subject == "Leasehold: 1 run waits for you"
    assert "1 run you were told about before still waits." in latest.body

    # The first run is decided and waits again on another turn: a new wait, told again.
    AgentRun.objects.filter(pk=first.pk).update(pending_turn=IN_DOUBT_TURN.to_json())
    AgentRun.objects.filter(pk=first.pk).update(status=Status.WAITING_FOR_RECONCILIATION)
    interval_passes()
    notify()
    assert uuids_in(told(alice.email)[-1], [first, second]) == {first.uuid}
    # What is remembered is what still waits: the first run's approval wait is forgotten.
    remembered = NotificationState.objects.get(user=alice).told
    assert len(remembered) == 2
    assert f"{first.pk}:waiting_for_reconciliation:{IN_DOUBT_TURN.turn_digest}" in remembered
    assert not any(key.startswith(f"{first.pk}:waiting_for_approval:") for key in remembered)


def test_a_write_in_doubt_is_announced_once_its_check_leaves_it_to_a_person():
    from dataclasses import replace

    from agentruns.turns.checks import CheckStatus

    alice = UserFactory(username="alice", permissions=[DECIDE])
    checking = replace(IN_DOUBT_TURN, check=CheckStatus.scheduled(3))
    run = AgentRunFactory(in_doubt=True, pending_turn=checking.to_json())

    assert notify().waiting == 0 and not mail.outbox  # the tool is still asking

    gave_up = replace(checking, check=replace(checking.check, state="left_to_person"))
    AgentRun.objects.filter(pk=run.pk).update(pending_turn=gave_up.to_json())
    notify()
    (message,) = told(alice.email)
    assert "reconciliation: did create_note land?" in message.body


def test_the_interval_switch_and_the_email_switch():
    UserFactory(username="alice", permissions=[DECIDE])
    AgentRunFactory(waiting=True)
    assert notify(NOTIFY_INTERVAL=0).off and not mail.outbox
    assert notify(NOTIFY_EMAIL=False).sent == {} and not mail.outbox
    with agentruns(NOTIFY_INTERVAL=0):
        assert notify_waiting() == "notifications are off (AGENTRUNS_NOTIFY_INTERVAL is 0)"
    with agentruns():
        assert notify_waiting().startswith("1 run(s) waiting; email: sent 1, failed 0")


def test_setup_schedules_adds_the_notification_pass_and_removes_it_when_switched_off():
    from django_q.models import Schedule

    with agentruns():
        schedules.schedules_setup()
    schedule = Schedule.objects.get(name=schedules.NOTIFY_SCHEDULE)
    assert (schedule.func, schedule.minutes) == ("agentruns.tasks.notify_waiting", 1)
    with agentruns(NOTIFY_INTERVAL=0):
        states = schedules.schedules_setup()
    assert not Schedule.objects.filter(name=schedules.NOTIFY_SCHEDULE).exists()
    assert any(s.name == schedules.NOTIFY_SCHEDULE and s.removed for s in states)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_send_one_digest_per_person():
    people = [UserFactory(username=f"p{n}", permissions=[DECIDE]) for n in range(3)]
    AgentRunFactory.create_batch(2, waiting=True)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def one_pass() -> None:
        try:
            barrier.wait()
            notify()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_pass) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    assert sorted(m.to[0] for m in mail.outbox) == sorted(p.email for p in people)
    assert Counter.objects.get(name="notifications_sent", labels="channel=email").value == 3


# --- Real SMTP, hostile text, failures ------------------------------------------------------------


def test_a_real_smtp_server_receives_the_digest_and_chosen_text_adds_no_header(smtp_server):
    alice = UserFactory(username="alice", permissions=[DECIDE])
    hostile = AgentConfigurationFactory(name="Evil\r\nBcc: victim@example.com\r\n\r\nbody")
    run = input_run(hostile, name="ask\nBcc: other@example.com")

    with override_settings(**smtp_server.settings(), DEFAULT_FROM_EMAIL="leasehold@example.com"):
        report = notify()

    assert report.sent == {"email": 1}
    (received,) = smtp_server.messages
    assert received.envelope_to == [alice.email]
    assert received.envelope_from == "leasehold@example.com"
    message = received.message
    assert message["Subject"] == "Leasehold: 1 run waits for you"
    assert message["Bcc"] is None and message["To"] == alice.email
    body = message.get_content()
    assert "Evil Bcc: victim@example.com body: input for ask Bcc: other@example.com" in body
    assert f"{SITE}/admin/approvals/runs/{run.uuid}/" in body


def test_a_failed_email_is_counted_never_touches_the_run_and_is_sent_after_the_interval(
    smtp_server, caplog
):
    alice = UserFactory(username="alice", permissions=[DECIDE])
    run = AgentRunFactory(waiting=True)
    before = row(run)
    nothing_listens = {**smtp_server.settings(), "EMAIL_PORT": free_port()}

    with override_settings(**nothing_listens):
        report = notify()

    assert report.failed == {"email": 1} and report.sent == {}
    assert row(run) == before
    assert Counter.objects.get(name="notification_failures", labels="channel=email").value == 1
    assert "notification email to user" in caplog.text
    assert NotificationState.objects.get(user=alice).told == []  # not told: it will be again

    with override_settings(**smtp_server.settings()):
        assert notify().sent == {}  # the failed attempt used this interval
        interval_passes()
        assert notify().sent == {"email": 1}
    assert [m.envelope_to for m in smtp_server.messages] == [[alice.email]]
    assert row(run) == before


def test_a_failed_count_never_fails_the_pass():
    UserFactory(username="alice", permissions=[DECIDE])
    AgentRunFactory(waiting=True)
    with connection.cursor() as cursor:  # the test's transaction brings it back
        cursor.execute(f"DROP TABLE {Counter._meta.db_table}")
    assert notify().sent == {"email": 1}


# --- Webhooks ------------------------------------------------------------------------------------


def test_a_configuration_webhook_gets_slack_json_with_its_text_escaped(http_recorder):
    configuration = AgentConfigurationFactory(
        name="<!channel> & <http://evil.example|click>",
        notify_webhook_url=http_recorder.url("/hooks/leasehold"),
    )
    run = AgentRunFactory(configuration=configuration, waiting=True)
    AgentRunFactory(waiting=True)  # another configuration's run: not this webhook's

    report = notify(WEBHOOK_ALLOWLIST=[http_recorder.netloc], NOTIFY_EMAIL=False)
    notify(WEBHOOK_ALLOWLIST=[http_recorder.netloc], NOTIFY_EMAIL=False)  # nothing new

    assert report.sent == {"webhook": 1}
    (request,) = http_recorder.requests
    assert (request.method, request.path) == ("POST", "/hooks/leasehold")
    assert request.headers["Content-Type"] == "application/json"
    body = json.loads(request.body)
    assert list(body) == ["text", "blocks"]  # the blocks: tests/agentruns/chat/test_slack_blocks.py
    shown = [block["text"]["text"] for block in body["blocks"] if "text" in block]
    assert all("<" not in said and ">" not in said for said in shown)
    text = body["text"]
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; &amp; &lt;http://evil.example|click&gt;" in text
    assert f"{SITE}/admin/approvals/runs/{run.uuid}/" in text
    assert text.count("\n") == 1  # the head line and one run


def test_webhook_failures_are_logged_counted_and_never_touch_the_run(
    http_recorder, webhook_receiver, caplog
):
    configuration = AgentConfigurationFactory(notify_webhook_url=http_recorder.url("/hook"))
    run = AgentRunFactory(configuration=configuration, waiting=True)
    before = row(run)

    # A host no longer allowed: nothing sent.
    assert notify(WEBHOOK_ALLOWLIST=[], NOTIFY_EMAIL=False).failed == {"webhook": 1}
    assert http_recorder.requests == []
    # A non-2xx answer.
    http_recorder.respond_with(500, b"down")
    interval_passes()
    assert notify(WEBHOOK_ALLOWLIST=[http_recorder.netloc], NOTIFY_EMAIL=False).failed == {
        "webhook": 1
    }
    assert len(http_recorder.requests) == 1
    # No answer in time (the receiver answers after 1.5 s).
    AgentConfiguration.objects.filter(pk=configuration.pk).update(
        notify_webhook_url=webhook_receiver.url()
    )
    interval_passes()
    slow = notify(
        WEBHOOK_ALLOWLIST=[webhook_receiver.netloc],
        NOTIFY_EMAIL=False,
        NOTIFY_WEBHOOK_TIMEOUT_SECONDS=0.3,
    )
    assert slow.failed == {"webhook": 1}

    assert row(run) == before
    assert Counter.objects.get(name="notification_failures", labels="channel=webhook").value == 3
    assert caplog.text.count("notification webhook of configuration") == 3
    assert "not in AGENTRUNS['WEBHOOK_ALLOWLIST']" in caplog.text
    assert "answered 500" in caplog.text


def test_a_webhook_url_is_checked_against_the_allowlist_when_saved():
    configuration = AgentConfigurationFactory(notify_webhook_url="")
    configuration.notify_webhook_url = "http://hooks.example/leasehold"
    with agentruns(WEBHOOK_ALLOWLIST=[]), pytest.raises(ValidationError) as refused:
        configuration.full_clean()
    assert "not in AGENTRUNS['WEBHOOK_ALLOWLIST']" in str(refused.value.message_dict)
    with agentruns(WEBHOOK_ALLOWLIST=["hooks.example"]):
        configuration.full_clean()
    configuration.notify_webhook_url = "http://user@hooks.example/leasehold"
    with agentruns(WEBHOOK_ALLOWLIST=["hooks.example"]), pytest.raises(ValidationError):
        configuration.full_clean()


# --- /metrics ------------------------------------------------------------------------------------


def test_metrics_show_notifications_by_channel():
    counter_add("notification_failures", 2, channel="webhook")
    counter_add("notifications_sent", 5, channel="email")
    client = Client()
    client.force_login(UserFactory(username="ops", permissions=["agentruns.view_all_agentruns"]))
    text = client.get("/metrics").content.decode()
    assert 'leasehold_notification_failures_total{channel="webhook"} 2.0' in text
    assert 'leasehold_notification_failures_total{channel="email"} 0.0' in text
    assert 'leasehold_notifications_sent_total{channel="email"} 5.0' in text


# --- Cost ----------------------------------------------------------------------------------------


def test_a_pass_costs_queries_per_recipient_not_per_waiting_run():
    from django.test.utils import CaptureQueriesContext

    for n in range(3):
        UserFactory(username=f"p{n}", permissions=[DECIDE])

    def queries_of_a_pass() -> int:
        with CaptureQueriesContext(connection) as queries:
            notify()
        return len(queries)

    assert queries_of_a_pass() == 1  # nothing waits: one SELECT
    AgentRunFactory(waiting=True)
    notify()  # creates each recipient's row
    interval_passes()
    AgentRunFactory.create_batch(2, waiting=True)
    with_news_few = queries_of_a_pass()
    idle_few = queries_of_a_pass()  # everything told: nobody is claimed
    interval_passes()
    AgentRunFactory.create_batch(40, waiting=True)
    with_news_many = queries_of_a_pass()
    idle_many = queries_of_a_pass()
    print(
        f"queries per pass, 3 recipients: {with_news_few} / {with_news_many} with news "
        f"(3 / 43 runs waiting), {idle_few} / {idle_many} idle"
    )
    assert with_news_many == with_news_few
    assert idle_many == idle_few < with_news_few


def test_the_admin_shows_the_state_read_only():
    root = UserFactory(username="root", is_superuser=True)
    AgentRunFactory(waiting=True)
    notify()
    client = Client()
    client.force_login(root)
    listing = client.get("/admin/agentruns/notificationstate/")
    assert listing.status_code == 200 and "root" in listing.content.decode()
    assert client.get("/admin/agentruns/notificationstate/add/").status_code == 403
