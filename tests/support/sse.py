"""Server-sent events as the two SDKs read them, for the local servers' streamed answers.

``chat_frames`` turns a chat completion (``chat_server.completion``) into the chunks of
``chat.completions.create(stream=True)``: ``data: {chunk}`` frames — a role delta, the content
in pieces, each tool call opened with its id and name and its argument text in pieces, a chunk
with the ``finish_reason``, the usage chunk (no choices) when ``stream_options.include_usage``
asked for it — then ``data: [DONE]``. ``message_frames`` turns a Messages API body
(``messages_server.message``) into ``messages.stream``'s sequence: ``message_start``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``) /
``content_block_stop``, ``message_delta`` (stop reason, output tokens), ``message_stop``.
``PIECE`` characters go in each delta, so that every answer arrives in several.
"""

from __future__ import annotations

import json
from typing import Any

PIECE = 4


def pieces(text: str, size: int = PIECE) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)] or []


def data(payload: Any) -> str:
    return "data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n"


def event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\n" + data(payload)


def chunk(completion: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    return data(
        {
            "id": completion.get("id", "chatcmpl-test"),
            "object": "chat.completion.chunk",
            "created": 0,
            "model": completion.get("model", "test-model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def chat_frames(completion: dict[str, Any], request: dict[str, Any]) -> list[str]:
    choice = completion["choices"][0]
    message = choice["message"]
    frames = [chunk(completion, {"role": "assistant", "content": ""})]
    frames += [chunk(completion, {"content": p}) for p in pieces(message.get("content") or "")]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function"}
        opening["function"] = {"name": function["name"], "arguments": ""}
        frames.append(chunk(completion, {"tool_calls": [opening]}))
        frames += [
            chunk(completion, {"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces(function["arguments"])
        ]
    frames.append(chunk(completion, {}, finish=choice["finish_reason"]))
    if (request.get("stream_options") or {}).get("include_usage"):
        frames.append(
            data(
                {
                    "id": completion.get("id", "chatcmpl-test"),
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": completion.get("model", "test-model"),
                    "choices": [],
                    "usage": completion.get("usage"),
                }
            )
        )
    frames.append(data("[DONE]"))
    return frames


def message_frames(message: dict[str, Any], request: dict[str, Any]) -> list[str]:
    usage = message.get("usage") or {}
    start = dict(message, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = {**usage, "output_tokens": 1}
    frames = [event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        frames += _block_frames(index, block)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message.get("stop_sequence")}
    frames.append(
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
        )
    )
    frames.append(event("message_stop", {"type": "message_stop"}))
    return frames


def _block_frames(index: int, block: dict[str, Any]) -> list[str]:
    if block["type"] == "text":
        opening, parts = {"type": "text", "text": ""}, pieces(block["text"])
        deltas = [{"type": "text_delta", "text": p} for p in parts]
    else:
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        parts = pieces(json.dumps(block["input"]))
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in parts]
    frames = [
        event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    frames += [
        event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    frames.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return frames
