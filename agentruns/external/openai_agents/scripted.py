"""A scripted model for the OpenAI Agents SDK: tests and examples without a network.

``ScriptedTurns`` implements the SDK's ``Model`` interface and plays turn N, where N is the number
of answers the model already gave in the input it is sent (the dialogue the SDK rebuilds, from a
stored ``RunState`` too). It keeps no state between calls that matters, so a worker in another
process that continues a stored run gets the same next answer as the process that started it,
like Leasehold's ``scripted`` provider (docs/design.md §6.7). A turn is a list of output items
(``call`` and ``say`` build them) or a function of the tool outputs the model read last, which
answers what happened (a denial and its reason, a reconciled write).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse, TResponseInputItem, TResponseOutputItem
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage

__all__ = ["ScriptedTurns", "Turn", "call", "say", "tool_outputs"]

#: A turn: output items, or a function of the last tool outputs ({call id: output}) giving them.
Turn = Sequence[TResponseOutputItem] | Callable[[dict[str, str]], Sequence[TResponseOutputItem]]


def call(name: str, arguments: Mapping[str, Any], *, call_id: str) -> TResponseOutputItem:
    """A function call the model makes: ``call_id`` is the id Leasehold keys the call by."""
    return function_call(name, dict(arguments), call_id=call_id)


def say(text: str) -> TResponseOutputItem:
    """A final answer: an assistant message with ``text``."""
    return assistant_message(text)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _from_model(item: Any) -> bool:
    kind = _field(item, "type")
    return kind == "function_call" or (
        kind in (None, "message") and _field(item, "role") == "assistant"
    )


def answers_given(items: Sequence[Any]) -> int:
    """How many answers the model gave in ``items``: runs of consecutive model items."""
    count, inside = 0, False
    for item in items:
        mine = _from_model(item)
        count += mine and not inside
        inside = mine
    return count


def tool_outputs(items: Sequence[Any]) -> dict[str, str]:
    """The tool outputs after the model's last answer in ``items``: {call id: output text}."""
    last: dict[str, str] = {}
    for item in items:
        if _from_model(item):
            last = {}
        elif _field(item, "type") == "function_call_output":
            output = _field(item, "output")
            last[str(_field(item, "call_id"))] = output if isinstance(output, str) else str(output)
    return last


class ScriptedTurns(Model):
    """Plays ``turns`` in order, chosen by the dialogue it is sent (not by a counter), and
    records each input it was sent in ``inputs`` (this process's calls only). A turn past the
    end raises ``ModelBehaviorError``: the script is exhausted."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self.inputs: list[list[Any]] = []

    def answer(self, items: Sequence[Any]) -> Sequence[TResponseOutputItem]:
        index = answers_given(items)
        if index >= len(self.turns):
            raise ModelBehaviorError(
                f"the script has {len(self.turns)} turns; turn {index + 1} asked"
            )
        turn = self.turns[index]
        return turn(tool_outputs(items)) if callable(turn) else turn

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items: list[Any] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        self.inputs.append(items)
        return ModelResponse(output=list(self.answer(items)), usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        raise ModelBehaviorError("ScriptedTurns does not stream: use Runner.run")
