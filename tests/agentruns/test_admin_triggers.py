"""The admin of schedules and event sources: edited there, validated, retimed on a change; the
records of starts and received events read-only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import RunSchedule, ScheduledStart
from agentruns.services.scheduled_runs import schedules_start_due
from tests.agentruns.support.triggers import SECRET, SECRET_ENV, event_source, schedule

pytestmark = pytest.mark.django_db


def form(timed: RunSchedule, **changes) -> dict:
    return {
        "configuration": timed.configuration_id,
        "name": timed.name,
        "kind": timed.kind,
        "cron": timed.cron,
        "interval_seconds": timed.interval_seconds or "",
        "time_zone": timed.time_zone,
        "prompt": timed.prompt,
        "initiator": timed.initiator_id,
        "enabled": "on",
        "next_run_at_0": timed.next_run_at.strftime("%Y-%m-%d") if timed.next_run_at else "",
        "next_run_at_1": timed.next_run_at.strftime("%H:%M:%S") if timed.next_run_at else "",
        **changes,
    }


def test_a_changed_timing_is_worked_out_afresh(admin_client):
    timed = schedule(next_run_at=timezone.now() + timedelta(days=3))
    url = f"/admin/agentruns/runschedule/{timed.pk}/change/"
    assert admin_client.get(url).status_code == 200

    response = admin_client.post(url, form(timed, kind="cron", cron="0 9 * * 1-5"))

    assert response.status_code == 302, response.context["adminform"].form.errors
    timed.refresh_from_db()
    assert (timed.kind, timed.next_run_at) == ("cron", None)


def test_a_bad_cron_expression_is_refused_in_the_admin(admin_client):
    timed = schedule(next_run_at=None)
    url = f"/admin/agentruns/runschedule/{timed.pk}/change/"
    response = admin_client.post(url, form(timed, kind="cron", cron="at nine"))
    assert response.status_code == 200
    assert "not a cron expression" in str(response.context["adminform"].form.errors)


def test_the_event_source_page_says_whether_its_secret_is_set_never_its_value(
    admin_client, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    event_source()
    page = admin_client.get("/admin/agentruns/eventsource/").content.decode()
    assert SECRET_ENV in page and SECRET not in page


def test_records_are_read_only(admin_client):
    timed = schedule(next_run_at=timezone.now() - timedelta(minutes=1))
    schedules_start_due()
    start = ScheduledStart.objects.get()
    assert admin_client.get("/admin/agentruns/scheduledstart/").status_code == 200
    assert admin_client.get("/admin/agentruns/scheduledstart/add/").status_code == 403
    page = admin_client.get(f"/admin/agentruns/scheduledstart/{start.pk}/change/")
    assert page.status_code == 200 and str(timed) in page.content.decode()
    assert admin_client.get("/admin/agentruns/receivedevent/").status_code == 200
