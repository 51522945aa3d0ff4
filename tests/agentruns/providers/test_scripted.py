"""The scripted provider's branches (``agentruns.providers.scripted``): a turn answers what
happened to the previous turn's calls, read from their tool messages as a model reads them."""

from __future__ import annotations

import json

import pytest

from agentruns.providers.base import ErrorKind, ProviderError
from agentruns.providers.scripted import ScriptedProvider
from agentruns.tools.result_kinds import (
    DENIED_MESSAGE,
    EXPIRED_MESSAGE,
    REFUSED_PREFIX,
    denied_message,
)

BRANCHES = [
    {"tool_calls": [{"name": "call_webhook", "arguments": {}}]},
    {
        "branches": [
            {"when": "denied", "content": "You denied it."},
            {"when": ["refused", "expired"], "content": "Not sent."},
            {"when": "error", "content": "It failed."},
            {"when": "answered", "content": "A person answered."},
            {"content": "Sent."},
        ]
    },
]


def after(*results: object) -> list[dict[str, object]]:
    """The dialogue after the first turn's calls, whose tool messages carry ``results``."""
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": ""},
        *({"role": "tool", "content": json.dumps(result)} for result in results),
    ]


@pytest.mark.parametrize(
    ("results", "answer"),
    [
        ([{"error": DENIED_MESSAGE}], "You denied it."),
        (
            [{"error": denied_message("alice"), "reason_given_by_the_reviewer": "no"}],
            "You denied it.",
        ),
        (
            [{"answered_by_a_person": "alice", "note": "…", "result": {"status": 200}}],
            "A person answered.",
        ),
        ([{"arguments_edited_by_a_person": "alice", "result": {"status": 200}}], "Sent."),
        ([{"arguments_edited_by_a_person": "alice", "error": "boom"}], "It failed."),
        ([{"error": EXPIRED_MESSAGE}], "Not sent."),
        ([{"error": REFUSED_PREFIX + "host not allowed"}], "Not sent."),
        ([{"error": "ConnectionError: could not connect"}], "It failed."),
        ([{"status": 500, "body": "oops"}], "Sent."),  # an HTTP status is a result
        ([{"status": 200}, {"error": DENIED_MESSAGE}], "You denied it."),  # any denial first
        ([{"status": 200}, {"error": "boom"}], "It failed."),
    ],
)
def test_a_scripted_turn_answers_what_happened_to_the_previous_calls(results, answer):
    provider = ScriptedProvider(script=BRANCHES)
    assert provider.complete(messages=after(*results), tools=[], run_uuid="r").content == answer


def test_a_scripted_turn_without_a_branch_for_what_happened_is_a_clear_fatal_error():
    provider = ScriptedProvider(
        script=[BRANCHES[0], {"branches": [{"when": "ok", "content": "x"}]}]
    )
    with pytest.raises(ProviderError) as caught:
        provider.complete(messages=after({"error": DENIED_MESSAGE}), tools=[], run_uuid="r")
    assert caught.value.kind == ErrorKind.SCRIPT_INVALID
    assert "turn 1 has no branch for a previous result that is 'denied'" in str(caught.value)
