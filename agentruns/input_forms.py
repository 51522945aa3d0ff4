"""A tool's input schema rendered as a Django form, for anyone who asks a human for input (the
approvals inbox, the playground).

``input_form_for(pending, data, prefix=...)`` is what both use: the spec and form of a pending
input turn. ``input_spec(schema, order=...)`` maps an object schema's properties to form fields
(text, number/integer, checkbox, enum select) and says in words what it cannot show;
``InputValuesForm`` parses what was posted into values keyed by schema key. Forms parse; they
decide nothing about a run (the services do).

Field order: a stored schema's properties may come back reordered (PostgreSQL's jsonb does not
keep object key order), so ``order`` — the pending turn's ``field_order``, the keys as the tool
declared them — decides the order; keys missing from it follow in their stored order.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms

from agentruns.tools.schemas import SchemaError
from agentruns.turns import INPUT, PendingTurn

SUPPORTED_TYPES = ("string", "integer", "number", "boolean")


@dataclass(frozen=True)
class InputSpec:
    """How an input schema maps to form fields.

    ``fields``/``keys``: the fields the inbox can show (form field name → field / schema key).
    ``blocking``: sentences saying why no form can be offered at all (a required field of a type
    the form cannot show, or no fields). ``omitted``: optional fields it cannot show, left out.
    """

    fields: dict[str, forms.Field]
    keys: dict[str, str]
    blocking: tuple[str, ...] = ()
    omitted: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return bool(self.fields) and not self.blocking


def _number(value: Any) -> float | int | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def _field_for(key: str, prop: dict[str, Any], *, required: bool) -> forms.Field | None:
    kind = prop.get("type")
    label = str(prop.get("title") or key)
    help_text = str(prop.get("description") or "")
    common: dict[str, Any] = {"label": label, "help_text": help_text, "required": required}
    if kind == "string":
        enum = prop.get("enum")
        if enum is not None:
            if not isinstance(enum, list) or not all(isinstance(v, str) for v in enum):
                return None
            blank = [] if required else [("", "(none)")]
            return forms.ChoiceField(choices=blank + [(v, v) for v in enum], **common)
        max_length = prop.get("maxLength")
        widget = (
            forms.Textarea(attrs={"rows": 3})
            if not isinstance(max_length, int) or max_length > 200
            else forms.TextInput
        )
        return forms.CharField(
            min_length=prop.get("minLength") if isinstance(prop.get("minLength"), int) else None,
            max_length=max_length if isinstance(max_length, int) else None,
            strip=False,
            widget=widget,
            **common,
        )
    if kind == "integer":
        return forms.IntegerField(
            min_value=_number(prop.get("minimum")),  # type: ignore[arg-type]  # a float works
            max_value=_number(prop.get("maximum")),  # type: ignore[arg-type]
            **common,
        )
    if kind == "number":
        return forms.FloatField(
            min_value=_number(prop.get("minimum")), max_value=_number(prop.get("maximum")), **common
        )
    if kind == "boolean":
        # A checkbox always answers: unticked is false.
        return forms.BooleanField(**{**common, "required": False})
    return None


def _ordered(properties: dict[str, Any], order: Iterable[str] | None) -> list[tuple[str, Any]]:
    """The properties in ``order`` (unknown keys in it ignored), then the rest as stored."""
    first = [k for k in dict.fromkeys(order or ()) if isinstance(k, str) and k in properties]
    rest = [k for k in properties if k not in first]
    return [(key, properties[key]) for key in first + rest]


def input_spec(schema: dict[str, Any], order: Iterable[str] | None = None) -> InputSpec:
    """The form fields for an object schema's properties (text, number/integer, checkbox, enum
    select), in ``order`` (the declared key order) where given."""
    properties = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(properties, dict):
        return InputSpec({}, {}, blocking=("The input schema is not an object with named fields.",))
    required: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else []
    fields: dict[str, forms.Field] = {}
    keys: dict[str, str] = {}
    blocking: list[str] = []
    omitted: list[str] = []
    for position, (key, prop) in enumerate(_ordered(properties, order)):
        field = _field_for(key, prop, required=key in required) if isinstance(prop, dict) else None
        if field is None:
            kind = prop.get("type") if isinstance(prop, dict) else None
            shown = kind if isinstance(kind, str) else "unspecified"
            sentence = f"The field “{key}” has the type “{shown}”, which this form cannot show"
            if key in required:
                blocking.append(f"{sentence}, and it is required.")
            else:
                omitted.append(f"{sentence}; it is optional and will be left out.")
            continue
        name = f"f{position}"
        fields[name] = field
        keys[name] = key
    if not properties:
        blocking.append("The input schema declares no fields.")
    return InputSpec(fields, keys, tuple(blocking), tuple(omitted))


class InputValuesForm(forms.Form):
    """The values a human supplies, one field per schema property (field names ``f0``, ``f1``…
    so any schema key is safe as a name)."""

    def __init__(self, *args: Any, spec: InputSpec, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec
        for name, field in spec.fields.items():
            self.fields[name] = copy.deepcopy(field)
        # Errors the service found that belong to no field, shown with the form (``str()``).
        self.schema_errors: list[SchemaError] = []

    def values(self) -> dict[str, Any]:
        """The cleaned values keyed by schema key; empty optional fields are left out."""
        values: dict[str, Any] = {}
        for name, key in self.spec.keys.items():
            value = self.cleaned_data.get(name)
            if value is None or value == "":
                continue
            values[key] = value
        return values

    def add_schema_errors(self, errors: Sequence[SchemaError]) -> None:
        """Errors the service's schema validation found beyond what the fields check (from
        ``InvalidInput.errors``). An error whose path starts at a field's schema key is shown on
        that field (with the rest of its path, if any); others on the form. None at all still
        marks the form as refused."""
        names: dict[str | int, str] = {key: name for name, key in self.spec.keys.items()}
        for error in errors or [SchemaError((), "The values do not match the schema.")]:
            name = names.get(error.path[0]) if error.path else None
            if name is None:
                self.schema_errors.append(error)
            else:
                self.add_error(name, str(error.below(1)))

    def problems(self) -> list[SchemaError]:
        """Every problem as a ``SchemaError`` at its schema key (form-wide ones at the root), field
        by field: what an ``InvalidInput`` carries when the form itself refused the values."""
        found = [
            SchemaError((self.spec.keys[name],) if name in self.spec.keys else (), str(error))
            for name, errors in self.errors.items()
            for error in errors
        ]
        return found + list(self.schema_errors)

    def error_sentences(self) -> list[str]:
        """Every problem as one sentence (``"<label>: <error>"`` for a field's), for a summary."""
        sentences = [
            f"{self[name].label}: {error}" if name in self.fields else str(error)
            for name, errors in self.errors.items()
            for error in errors
        ]
        return sentences + [str(error) for error in self.schema_errors]

    @property
    def has_problems(self) -> bool:
        return bool(self.errors) or bool(self.schema_errors)


def input_form_for(
    pending: PendingTurn, data: Any | None = None, *, prefix: str
) -> tuple[InputSpec, InputValuesForm | None]:
    """The spec of a pending input turn's schema, in the order the tool declared its fields, and
    its form (field names ``<prefix>-f0``…), bound to ``data`` when given. No form when the spec
    cannot be offered (``spec.blocking`` says why). ``ValueError`` for a turn of another kind:
    the caller reads the turn and decides what to show for those."""
    if pending.kind != INPUT:
        raise ValueError(f"not an input turn: {pending.kind}")
    spec = input_spec(pending.input_schema or {}, order=pending.field_order)
    form = InputValuesForm(data, spec=spec, prefix=prefix) if spec.usable else None
    return spec, form
