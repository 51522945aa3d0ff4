"""Leasehold's dialogue (OpenAI chat messages) written as the Messages API takes it: roles
alternate, nothing empty is sent, tool results come first and stay paired with their calls."""

from __future__ import annotations

from agentruns.providers.anthropic_dialogue import messages_request, wire_id
from agentruns.providers.base import UNPARSED_KEY


def call(call_id: str, arguments: str = "{}") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}}


def test_an_empty_answer_is_left_out_and_the_user_turns_around_it_merge():
    request = messages_request(
        [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "the prompt"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "try again"},
        ],
        [],
    )

    assert request.system == "rules"
    assert request.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "the prompt"},
                {"type": "text", "text": "try again"},
            ],
        }
    ]
    assert request.arguments() == {"system": "rules", "messages": request.messages}


def test_tool_results_come_before_text_in_the_user_message_that_follows_a_call():
    request = messages_request(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [call("toolu_1")]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "{}"},
            {"role": "user", "content": "and now?"},
        ],
        [],
    )

    assert [block["type"] for block in request.messages[-1]["content"]] == [
        "tool_result",
        "text",
    ]


def test_arguments_that_are_not_an_object_are_sent_as_the_marker_the_model_saw():
    request = messages_request(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [call("toolu_1", "[1, 2")]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": '{"error": "not JSON"}'},
        ],
        [{"type": "function", "function": {"name": "f"}}],
    )

    assert request.messages[1]["content"][0]["input"] == {UNPARSED_KEY: "[1, 2"}
    assert request.tools == [{"name": "f", "input_schema": {"type": "object"}}]
    assert request.tool_choice is None


def test_ids_the_api_takes_are_kept_and_others_are_mapped_apart():
    assert wire_id("toolu_01A-b") == "toolu_01A-b"
    mapped = {wire_id(i) for i in ("call_1~2", "call_1~3", "call 1", "x" * 65, "call_1~2")}
    assert len(mapped) == 4
    assert all(m.startswith("lh_") and len(m) == 43 for m in mapped)
