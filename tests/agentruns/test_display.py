"""Words and times every screen shows the same way (issue 17 §5, §6): ``agentruns.display``, the
``leasehold`` template tags and the time zone middleware."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.http import HttpResponse
from django.template import Context, Template
from django.test import RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from agentruns import display
from agentruns.middleware import TimeZoneMiddleware, user_time_zone
from agentruns.models import Effect
from agentruns.turns import Call
from tests.agentruns.factories import UserFactory
from tests.approvals.conftest import DECIDE, start_waiting_run

MOMENT = datetime(2026, 11, 30, 21, 40, 20, 123456, tzinfo=UTC)


def render(source: str, **context) -> str:
    return Template("{% load leasehold %}" + source).render(Context(context))


def test_slugs_read_as_words_and_unknown_values_as_they_are():
    assert display.status_label("waiting_for_approval") == "waiting for approval"
    assert display.reason_label("max_iterations") == "reached the round cap"
    assert display.event_kind_label("llm") == "model answer"
    assert display.lookup(display.LEASE_ACTIONS, "claimed_at_birth") == (
        "claimed when the run started"
    )
    assert display.status_label("from_the_future") == "from_the_future"
    assert display.lookup(display.TOOL_OUTCOMES, None) == ""


def test_rounds_are_numbered_from_one_everywhere():
    assert display.round_number({"iteration": 0}) == 1
    assert display.round_number({"iteration": "0"}) is None
    assert display.round_number("corrupt") is None


def test_writes_come_first_keeping_their_positions():
    calls = [
        Call(id="a", name="list_notes", effect=Effect.READ),
        Call(id="b", name="create_note", effect=Effect.NON_IDEMPOTENT_WRITE),
        Call(id="c", name="mystery", effect=""),
    ]
    assert [(i, c.id) for i, c in display.writes_first(calls)] == [(2, "b"), (3, "c"), (1, "a")]


def test_the_effect_badge_says_it_in_words_with_an_icon_hidden_from_screen_readers():
    html = render("{% effect_badge e %}", e="non_idempotent_write")
    assert "<strong>Write</strong>" in html and "not safe to repeat" in html
    assert 'aria-hidden="true">⚠</span>' in html and "lh-effect-non_idempotent_write" in html
    assert "Read" in render("{% effect_badge e %}", e="read")
    unknown = render("{% effect_badge e %}", e='"><script>')
    assert "lh-effect-unknown" in unknown and "<script>" not in unknown


def test_a_run_id_is_short_with_the_full_id_on_hover():
    full = "7b7e07e3-f9f9-4df0-8b83-514e1eaa8828"
    html = render("{% run_id u %}", u=full)
    assert html == f'<code class="lh-run-id" title="{full}" data-run-id="{full}">7b7e07e3</code>'


@override_settings(TIME_ZONE="Europe/Berlin")
def test_a_time_is_shown_to_the_second_in_the_zone_with_the_exact_value_on_hover():
    with timezone.override("Europe/Berlin"):
        html = render("{% when t %} {% time_zone_name %}", t=MOMENT)
    assert ">2026-11-30 22:40:20 CET</time>" in html
    assert 'title="2026-11-30T22:40:20.123456+01:00"' in html
    assert html.endswith(" Europe/Berlin")
    assert render("{% when t %}", t=None) == "—"


def test_ages_read_like_people_say_them():
    now = timezone.now()
    assert render("{{ t|ago }}", t=now - timedelta(minutes=3, seconds=5)) == "3\xa0minutes ago"
    assert render("{{ t|ago }}", t=now + timedelta(minutes=2)) == "just now"  # a skewed clock
    assert render("{{ t|ago }}", t=now - timedelta(seconds=10)) == "just now"


def test_a_user_s_own_zone_wins_and_a_bad_one_is_ignored():
    assert str(user_time_zone(SimpleNamespace(is_authenticated=True, time_zone="Asia/Tokyo"))) == (
        "Asia/Tokyo"
    )
    assert user_time_zone(SimpleNamespace(is_authenticated=True, time_zone="Mars/Olympus")) is None
    assert user_time_zone(SimpleNamespace(is_authenticated=True)) is None
    seen = []

    def view(request):
        seen.append(timezone.get_current_timezone_name())
        return HttpResponse()

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(is_authenticated=True, time_zone="Asia/Tokyo")
    TimeZoneMiddleware(view)(request)
    request.user = SimpleNamespace(is_authenticated=False)
    TimeZoneMiddleware(view)(request)
    assert seen == ["Asia/Tokyo", "UTC"]
    assert timezone.get_current_timezone_name() == "UTC"  # nothing leaks to the next request


@pytest.mark.django_db
@override_settings(TIME_ZONE="America/New_York")
def test_the_timeline_shows_the_page_s_zone_and_labels(client):
    run = start_waiting_run(initiator=UserFactory(username="starter", permissions=[DECIDE]))
    client.force_login(UserFactory(username="reader", permissions=[DECIDE]))
    html = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "Times are in America/New_York" in html
    assert " EST</time>" in html or " EDT</time>" in html
    assert "claimed when the run started" in html and "claimed_at_birth" not in html
    assert "Asked the model, round 1" in html
