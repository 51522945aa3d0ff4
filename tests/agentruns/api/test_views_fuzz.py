"""A bounded schemathesis run against the live OpenAPI document (issue 11, "Proof in CI").

The schema is read from the running application (``/api/schema/`` through its WSGI handler, as a
client would read it) and every documented operation is called with at least 20 generated
requests, valid and invalid, from a fixed seed. Each answer must not be a server error and must
agree with the document: a documented status code and content type, a body matching the
documented schema, invalid input refused and valid input not refused for its shape.

Requests are authenticated as a superuser with a token, so they reach the views rather than
stopping at 401. Runs started by generated requests use the scripted provider of the
configurations made here; nothing leaves the machine.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks

from agentruns.models import AgentRun
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import in_doubt, waiting_for_approval, waiting_for_input

pytestmark = pytest.mark.django_db

EXAMPLES = 20


@pytest.fixture
def token(db) -> str:
    user = UserFactory(username="fuzzer", is_staff=True, is_superuser=True)
    AgentConfigurationFactory(slug="hello", script=[{"content": "hi"}])
    return Token.objects.create(user=user).key


@pytest.fixture
def wsgi_app(db):
    """The project's WSGI handler, without closing the test's database connection at the end of
    each request (what Django's own test client does too)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(token, wsgi_app):
    schema = schemathesis.openapi.from_wsgi(
        "/api/schema/",
        wsgi_app,
        headers={
            "Authorization": f"Token {token}",
            "Accept": "application/vnd.oai.openapi+json",
        },
    )
    # A NUL character is refused in every body (``StrictJSONParser``: PostgreSQL cannot store
    # it; documented with the API's limits), which a JSON schema cannot say.
    schema.config.generation.update(allow_x00=False)
    return schema


# Checks that cannot hold for one operation, and why. The document cannot say "the slug of an
# active configuration", so a generated slug is schema-valid and refused with a 400 naming the
# field (documented) — which ``positive_data_acceptance`` would report.
# Likewise "each open call's id, exactly once" for a decision per call: generated ``calls`` are
# refused with a 400 naming what is missing, named twice or not open (documented).
NOT_CHECKED: dict[str, list] = {
    "POST /api/runs/": [checks.positive_data_acceptance],
    "POST /api/runs/{uuid}/decision/": [checks.positive_data_acceptance],
    # Likewise "a tool this configuration offers", "a schema the bounded checker accepts" and
    # "at most 30 days from now" for a standing approval: refused with a 400 naming the field.
    "POST /api/approval-rules/": [checks.positive_data_acceptance],
}


def real_run(label: str, index: int) -> AgentRun:
    """A run an operation on ``{uuid}`` can act on: waiting for what the operation decides."""
    if label.endswith("/input/"):
        return waiting_for_input()
    if label.endswith("/reconciliation/"):
        return in_doubt()
    return waiting_for_approval(slug=f"notes-{index}")


def generated_requests(operation, mode, auth, path_parameters, calls: list[int]):
    """A Hypothesis test sending ``EXAMPLES`` generated requests to ``operation``, validating
    each answer against the document; ``calls`` counts them."""

    # The token is the case's own header, so schemathesis knows it is the credential: its auth
    # checks send the request again without it and with a wrong one, expecting 401.
    @given(
        case=operation.as_strategy(
            generation_mode=mode, headers=auth, path_parameters=path_parameters
        )
    )
    @settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case) -> None:
        calls.append(1)
        response = case.call()
        case.validate_response(response, excluded_checks=NOT_CHECKED.get(operation.label, []))

    return check


@pytest.mark.parametrize("target", ["generated", "real"])
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda mode: mode.value)
def test_every_operation_answers_as_documented(api_schema, token, mode, target):
    """Each operation, ``EXAMPLES`` generated requests in ``mode``: valid requests, or requests
    that break the document (wrong types, missing or extra fields, bad enum values). With
    ``target="real"``, an operation on a run is aimed at a run waiting for it (so bodies reach
    the decision services, not only a 404); the rest of the request is generated."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 8  # the document was read, not an empty one
    auth = {"Authorization": f"Token {token}"}
    failures: list[str] = []
    for index, operation in enumerate(operations):
        path_parameters = None
        if target == "real":
            if "{uuid}" not in operation.path:
                continue
            path_parameters = {"uuid": str(real_run(operation.label, index).uuid)}
        calls: list[int] = []
        check = generated_requests(operation, mode, auth, path_parameters, calls)
        try:
            check()
        except Unsatisfiable:
            # Aimed at a real run, an operation whose only parameter is that run's uuid has
            # nothing left to break: no invalid request of it can be generated.
            assert target == "real" and mode == GenerationMode.NEGATIVE, operation.label
            assert not operation.body and not operation.query, operation.label
            continue
        except Exception as exc:  # every failure of every operation is reported
            failures.append(f"{operation.label}: {exc}")
        assert len(calls) >= EXAMPLES, f"{operation.label}: {len(calls)} requests"
    assert not failures, "\n\n".join(failures)
