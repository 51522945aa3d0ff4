"""The bodies of the decision endpoints (approve / deny per turn or per call, input,
reconciliation): each serializer's validated data are its service's keyword arguments."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agentruns.api.serializers import DECISION_MODE_CHOICES
from agentruns.services import runs
from agentruns.turns import MAX_ANSWER_CHARS, MAX_REASON_CHARS, VERDICTS, CallVerdict


class _DecisionBase(serializers.Serializer):
    turn_digest = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        default=None,
        help_text="The digest of the pending turn you saw; missing or stale → 409.",
    )
    mode = serializers.ChoiceField(choices=DECISION_MODE_CHOICES, default="queued")


class CallVerdictSerializer(serializers.Serializer):
    """One call's verdict in a decision per call (``agentruns.turns.CallVerdict``)."""

    id = serializers.CharField(trim_whitespace=False, help_text="The call's id.")
    verdict = serializers.ChoiceField(choices=[(v, v) for v in VERDICTS])
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        default="",
        help_text=f"deny: why, for the model (plain text, at most {MAX_REASON_CHARS:,} "
        "characters, passed on verbatim as the reviewer's words).",
    )
    answer = serializers.JSONField(
        required=False,
        default=None,
        help_text=f"answer: the result the model receives in place of running the tool (a JSON "
        f"value or text, at most {MAX_ANSWER_CHARS:,} characters).",
    )
    arguments = serializers.JSONField(
        required=False,
        default=None,
        help_text="edit: the edited arguments (a JSON object valid for the tool's schema; 422 "
        "invalid_arguments names the field otherwise). An edit runs nothing: the run waits on a "
        "new card.",
    )


class DecisionSerializer(_DecisionBase):
    """Decide the whole turn (``approved``, with an optional ``reason`` for a denial) or each
    call (``calls``: every open call named once). The validated data are
    ``services.decisions.run_decide``'s keyword arguments."""

    approved = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="Every open call alike."
    )
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        default="",
        help_text=f"A whole-turn denial's reason (at most {MAX_REASON_CHARS:,} characters).",
    )
    calls = CallVerdictSerializer(
        many=True, required=False, default=None, help_text="A verdict per open call."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        calls = attrs.pop("calls", None)
        attrs["verdicts"] = (
            None
            if calls is None
            else [
                CallVerdict(
                    call_id=call["id"],
                    verdict=call["verdict"],
                    reason=call["reason"],
                    answer=call["answer"],
                    arguments=call["arguments"],
                )
                for call in calls
            ]
        )
        return attrs


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A JSON object (an input schema's values are always one): anything else is a 400."""

    default_error_messages = {"not_an_object": "Expected a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_an_object")
        return value


class InputSerializer(_DecisionBase):
    values = JSONObjectField(help_text="Values for the pending input schema (a JSON object).")


class ReconciliationSerializer(_DecisionBase):
    verdict = serializers.ChoiceField(choices=[(v, v) for v in runs.RECONCILIATION_VERDICTS])
