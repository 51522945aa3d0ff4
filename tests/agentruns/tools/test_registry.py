"""The tool registry: definitions, resolution, fail-closed effects, invocation and human input."""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import pytest

from agentruns.models import Effect
from agentruns.tools import (
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolRegistry,
    ToolResult,
    invoke_tool,
    overlay_input,
    registry,
    tool,
    validate_input,
)
from agentruns.tools.schemas import SchemaError

ARGS = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}},
    "required": ["n"],
    "additionalProperties": False,
}


def context() -> ToolContext:
    return ToolContext(
        run_uuid=uuid.uuid4(), call_id="call-1", initiator_id=None, fencing_token=3,
        timeout_seconds=1.0,
    )  # fmt: skip


def double(ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"doubled": arguments["n"] * 2}


def make(
    name: str = "double", effect: Effect = Effect.READ, func: Any = double, **extra: Any
) -> Tool:
    return Tool(
        name=name, description="Doubles n.", parameters=ARGS, effect=effect, func=func, **extra
    )


INPUT_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "priority": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


# --- registration -----------------------------------------------------------------------------


def test_register_and_get() -> None:
    reg = ToolRegistry()
    defined = make()
    assert reg.register(defined) is defined
    assert reg.get("double") is defined
    assert reg.all() == [defined]
    assert reg.effect_of("double") == Effect.READ


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "dot.ted", "é", "a/b"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ToolDefinitionError):
        ToolRegistry().register(make(name=name))


def test_names_at_the_limits_are_accepted() -> None:
    reg = ToolRegistry()
    reg.register(make(name="a" * 64))
    reg.register(make(name="A-z_0"))
    assert {t.name for t in reg.all()} == {"a" * 64, "A-z_0"}


@pytest.mark.parametrize("effect", [Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE])
def test_write_tool_with_input_schema_is_refused(effect: Effect) -> None:
    reg = ToolRegistry()
    with pytest.raises(ToolDefinitionError, match="input"):
        reg.register(make(effect=effect, input_schema=INPUT_SCHEMA))
    assert reg.get("double") is None


def test_read_tool_with_input_schema_is_accepted() -> None:
    params = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "answer": {"type": "string"}},
        "additionalProperties": True,
    }
    reg = ToolRegistry()
    defined = Tool("ask", "Asks.", params, Effect.READ, double, input_schema=INPUT_SCHEMA)
    reg.register(defined)
    assert reg.get("ask").needs_input


def test_input_keys_the_parameters_reject_are_refused() -> None:
    """With additionalProperties false, an overlaid ``priority`` could never validate."""
    with pytest.raises(ToolDefinitionError, match="priority"):
        ToolRegistry().register(make(input_schema=INPUT_SCHEMA))


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "properties": 3},
        {"type": "strnig"},
        {"type": "array"},
        "object",
        {"type": "object", "properties": {"code": {"type": "string", "pattern": "(unclosed"}}},
        {"type": "object", "properties": {"code": {"type": "string", "pattern": "(a)\\1"}}},
    ],
)
def test_invalid_schemas_are_refused(parameters: Any) -> None:
    with pytest.raises(ToolDefinitionError):
        ToolRegistry().register(Tool("p", "d", parameters, Effect.READ, double))


@pytest.mark.parametrize("where", ["parameters", "input_schema"])
def test_a_schema_referring_outside_itself_is_refused_at_registration(where: str) -> None:
    remote = {
        "type": "object",
        "properties": {"answer": {"$ref": "http://127.0.0.1:8783/x.json"}},
    }
    fields: dict[str, Any] = {"parameters": ARGS, "input_schema": None, where: remote}
    defined = Tool("remote", "d", effect=Effect.READ, func=double, **fields)
    with pytest.raises(ToolDefinitionError, match=re.escape("http://127.0.0.1:8783/x.json")):
        ToolRegistry().register(defined)
    with pytest.raises(ToolDefinitionError, match="only references inside the schema"):
        tool(name="remote", description="d", effect=Effect.READ, **fields)(double)


def test_unknown_effect_is_refused() -> None:
    with pytest.raises(ValueError):
        make(effect="write")  # type: ignore[arg-type]


def test_duplicate_name_with_a_different_definition_is_refused() -> None:
    reg = ToolRegistry()
    first = reg.register(make())
    with pytest.raises(ToolDefinitionError, match="already registered"):
        reg.register(make(effect=Effect.IDEMPOTENT_WRITE))
    with pytest.raises(ToolDefinitionError):
        reg.register(make(func=lambda ctx, args: None))
    assert reg.get("double") is first
    assert reg.effect_of("double") == Effect.READ


def test_reregistering_the_identical_definition_is_idempotent() -> None:
    reg = ToolRegistry()
    first = reg.register(make())
    assert reg.register(make()) is first  # an equal, separately built definition
    assert len(reg.all()) == 1


def test_playground_tools_are_registered_by_the_app_and_ready_can_run_twice() -> None:
    from django.apps import apps

    before = [t.name for t in registry.all()]
    apps.get_app_config("playground").ready()
    assert [t.name for t in registry.all()] == before
    assert {"list_notes", "create_note", "call_webhook", "ask_human"} <= set(before)


def test_decorator_builds_a_checked_tool_without_registering() -> None:
    @tool(name="decorated_only", description="d", effect=Effect.READ)
    def decorated(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        return "x"

    assert isinstance(decorated, Tool)
    assert decorated.parameters["type"] == "object"
    assert registry.get("decorated_only") is None
    with pytest.raises(ToolDefinitionError):
        tool(name="bad name", description="d", effect=Effect.READ)(double)
    with pytest.raises(ToolDefinitionError):
        tool(name="w", description="d", effect=Effect.IDEMPOTENT_WRITE, input_schema=INPUT_SCHEMA)(
            double
        )


@pytest.mark.parametrize(
    "permission", ["playground.approve_webhooks", "auth.add_user", "my_app.Can_2"]
)
def test_an_approve_permission_is_declared_in_code(permission: str) -> None:
    reg = ToolRegistry()
    defined = reg.register(make(approve_permission=permission))
    assert reg.get("double").approve_permission == permission  # type: ignore[union-attr]
    assert make().approve_permission is None
    # Part of the definition: the same name with another permission is a different tool.
    with pytest.raises(ToolDefinitionError, match="already registered"):
        reg.register(make(approve_permission="other.perm"))
    assert reg.get("double") is defined


@pytest.mark.parametrize(
    "permission",
    ["", "approve_webhooks", "playground.", ".approve", "a.b.c", "play ground.x", "a.b c", 3],
)
def test_a_malformed_approve_permission_is_refused(permission: Any) -> None:
    with pytest.raises(ToolDefinitionError, match="approve_permission"):
        ToolRegistry().register(make(approve_permission=permission))
    with pytest.raises(ToolDefinitionError, match="approve_permission"):
        tool(name="w", description="d", effect=Effect.READ, approve_permission=permission)(double)


# --- effects, approval, schema ----------------------------------------------------------------


def test_unknown_name_fails_closed_to_non_idempotent_write() -> None:
    assert ToolRegistry().effect_of("no_such_tool") == Effect.NON_IDEMPOTENT_WRITE
    assert registry.effect_of("no_such_tool") == Effect.NON_IDEMPOTENT_WRITE


@pytest.mark.parametrize(
    ("effect", "requires_approval", "expected"),
    [
        (Effect.READ, None, False),
        (Effect.IDEMPOTENT_WRITE, None, True),
        (Effect.NON_IDEMPOTENT_WRITE, None, True),
        (Effect.READ, True, True),
        (Effect.NON_IDEMPOTENT_WRITE, False, False),
    ],
)
def test_needs_approval(effect: Effect, requires_approval: bool | None, expected: bool) -> None:
    assert make(effect=effect, requires_approval=requires_approval).needs_approval is expected


def test_openai_schema_is_a_copy() -> None:
    defined = make()
    schema = defined.openai_schema()
    assert schema == {
        "type": "function",
        "function": {"name": "double", "description": "Doubles n.", "parameters": ARGS},
    }
    schema["function"]["parameters"]["properties"].clear()
    assert defined.parameters["properties"]


# --- resolvers --------------------------------------------------------------------------------


def test_resolvers_are_consulted_after_static_tools_and_never_shadow_them() -> None:
    reg = ToolRegistry()
    static = reg.register(make())
    remote = make(name="remote_write", effect=Effect.IDEMPOTENT_WRITE, source="mcp")
    impostor = make(name="double", effect=Effect.READ, source="mcp", requires_approval=False)
    offered = {"remote_write": remote, "double": impostor}
    reg.add_resolver(offered.get, list_tools=lambda: list(offered.values()))

    assert reg.get("double") is static
    assert reg.get("remote_write") is remote
    assert reg.effect_of("remote_write") == Effect.IDEMPOTENT_WRITE
    assert [t.name for t in reg.all()] == ["double", "remote_write"]
    assert [t.name for t in reg.all(include_resolvers=False)] == ["double"]

    reg.remove_resolver(offered.get)
    assert reg.get("remote_write") is None
    assert reg.effect_of("remote_write") == Effect.NON_IDEMPOTENT_WRITE


def test_a_failing_or_lying_resolver_fails_closed(caplog: pytest.LogCaptureFixture) -> None:
    reg = ToolRegistry()

    def broken(name: str) -> Tool | None:
        raise RuntimeError("server down")

    reg.add_resolver(broken, list_tools=lambda: (_ for _ in ()).throw(RuntimeError("down")))
    reg.add_resolver(lambda name: make(name="other", effect=Effect.READ))
    with caplog.at_level(logging.WARNING):
        assert reg.get("anything") is None
        assert reg.effect_of("anything") == Effect.NON_IDEMPOTENT_WRITE
        assert reg.all() == []
    assert "server down" in caplog.text


def test_select_honours_the_allow_list() -> None:
    reg = ToolRegistry()
    reg.register_all([make(name="a"), make(name="b"), make(name="c")])
    assert [t.name for t in reg.select([])] == ["a", "b", "c"]
    assert [t.name for t in reg.select(["c", "a", "missing", "c"])] == ["c", "a"]


# --- invocation -------------------------------------------------------------------------------


class Spy:
    def __init__(self, returns: Any = "done", raises: Exception | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.returns = returns
        self.raises = raises

    def __call__(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        self.calls.append(arguments)
        if self.raises is not None:
            raise self.raises
        return self.returns


def test_valid_arguments_run_the_tool() -> None:
    result = invoke_tool(make(), {"n": 21}, context())
    assert result == ToolResult(ok=True, content={"doubled": 42})
    assert result.as_message_content() == '{"doubled": 42}'


def test_the_context_reaches_the_tool() -> None:
    seen: list[ToolContext] = []
    ctx = context()
    invoke_tool(make(func=lambda c, a: seen.append(c)), {"n": 1}, ctx)
    assert seen == [ctx]
    assert ctx.idempotency_key == f"{ctx.run_uuid}:call-1"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "'n' is a required property"),
        ({"n": "two"}, "n: 'two' is not of type 'integer'"),
        ({"n": -1}, "n: -1 is less than the minimum of 0"),
        ({"n": 1, "extra": True}, "'extra' was unexpected"),
        ([1], "must be a JSON object"),
        ("{'n': 1}", "must be a JSON object"),
        (None, "must be a JSON object"),
        ({"_unparsed_arguments": '{"n": 1'}, "were not valid JSON"),
    ],
)
def test_invalid_arguments_become_an_error_and_the_body_never_runs(
    arguments: Any, fragment: str
) -> None:
    spy = Spy()
    result = invoke_tool(make(func=spy), arguments, context())
    assert result.ok is False
    assert fragment in result.error
    assert "double" in result.error
    assert spy.calls == []
    assert result.as_message_content().startswith('{"error": ')


def test_a_raising_tool_becomes_an_error_result(caplog: pytest.LogCaptureFixture) -> None:
    spy = Spy(raises=KeyError("gone"))
    with caplog.at_level(logging.ERROR, logger="agentruns.tools.registry"):
        result = invoke_tool(make(func=spy), {"n": 1}, context())
    assert result == ToolResult(ok=False, content=None, error="KeyError: 'gone'")
    assert len(spy.calls) == 1
    assert caplog.records and caplog.records[0].exc_info is not None


@pytest.mark.parametrize("returned", [object(), {1, 2}, {"x": b"bytes"}])
def test_a_non_serialisable_result_becomes_an_error(returned: Any) -> None:
    result = invoke_tool(make(func=Spy(returns=returned)), {"n": 1}, context())
    assert result.ok is False
    assert "ran, but returned what JSON cannot hold" in result.error


def test_a_result_that_is_not_finite_is_mended_not_refused() -> None:
    result = invoke_tool(make(func=Spy(returns={"x": float("nan")})), {"n": 1}, context())
    assert (result.ok, result.content, result.normalised) == (True, {"x": "NaN"}, ("number",))


def test_content_is_the_json_round_trip() -> None:
    result = invoke_tool(make(func=Spy(returns={"t": (1, 2)})), {"n": 1}, context())
    assert result.content == {"t": [1, 2]}


def test_the_body_cannot_mutate_the_callers_arguments() -> None:
    def mutate(ctx: ToolContext, arguments: dict[str, Any]) -> None:
        arguments["n"] = 99

    arguments = {"n": 1}
    invoke_tool(make(func=mutate), arguments, context())
    assert arguments == {"n": 1}


def test_error_message_content() -> None:
    assert ToolResult(ok=False, content=None, error="boom").as_message_content() == (
        '{"error": "boom"}'
    )
    assert ToolResult(ok=True, content="héllo").as_message_content() == '"héllo"'


# --- human input ------------------------------------------------------------------------------

ASK_PARAMS = {
    "type": "object",
    "properties": {
        "question": {"type": "string"},
        "answer": {"type": "string"},
        "priority": {"type": "integer"},
    },
    "required": ["question"],
    "additionalProperties": False,
}


def ask() -> Tool:
    return Tool("ask", "Asks.", ASK_PARAMS, Effect.READ, double, input_schema=INPUT_SCHEMA)


def test_validate_input_accepts_valid_values() -> None:
    assert validate_input(ask(), {"answer": "yes", "priority": 2}) == []
    assert validate_input(ask(), {"answer": "yes"}) == []


@pytest.mark.parametrize(
    ("values", "path", "fragment"),
    [
        ({}, (), "'answer' is a required property"),
        ({"answer": 3}, ("answer",), "3 is not of type 'string'"),
        ({"answer": "y", "priority": "high"}, ("priority",), "'high' is not of type 'integer'"),
        ({"answer": "y", "sneaky": 1}, (), "'sneaky' was unexpected"),
        (["answer"], (), "must be an object"),
    ],
)
def test_validate_input_reports_problems(values: Any, path: tuple, fragment: str) -> None:
    errors = validate_input(ask(), values)
    assert any(e.path == path and fragment in e.message for e in errors), errors


def test_validate_input_for_a_tool_without_input_schema() -> None:
    assert validate_input(make(), {"answer": "x"}) == [
        SchemaError((), "tool 'double' takes no human input")
    ]


def test_overlay_keeps_model_only_keys_and_ignores_undeclared_human_keys() -> None:
    model_args = {"question": "Ship it?", "answer": "model guess"}
    human = {"answer": "no", "priority": 1, "question": "rewritten", "sneaky": True}
    merged = overlay_input(ask(), model_args, human)
    assert merged == {"question": "Ship it?", "answer": "no", "priority": 1}
    assert model_args == {"question": "Ship it?", "answer": "model guess"}


def test_overlay_only_replaces_keys_the_human_supplied() -> None:
    merged = overlay_input(ask(), {"question": "q", "priority": 5}, {"answer": "a"})
    assert merged == {"question": "q", "answer": "a", "priority": 5}


def test_overlaid_arguments_then_validate_and_run() -> None:
    spy = Spy(returns="ok")
    defined = Tool("ask", "Asks.", ASK_PARAMS, Effect.READ, spy, input_schema=INPUT_SCHEMA)
    merged = overlay_input(defined, {"question": "q"}, {"answer": "a", "priority": 2})
    assert invoke_tool(defined, merged, context()).ok
    assert spy.calls == [{"question": "q", "answer": "a", "priority": 2}]
