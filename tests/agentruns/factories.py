"""Factories for the run domain, with traits for each state."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from agentruns.models import AgentConfiguration, AgentRun, Provider, Status


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "pw")
    is_staff = True

    @factory.post_generation
    def permissions(self, create: bool, extracted: list[str] | None, **kwargs) -> None:
        if not create or not extracted:
            return
        for codename in extracted:
            app_label, code = codename.split(".")
            self.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=code)
            )


class AgentConfigurationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AgentConfiguration
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"config-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())
    provider = Provider.SCRIPTED
    script = factory.LazyFunction(lambda: [{"content": "done"}])


class AgentRunFactory(factory.django.DjangoModelFactory):
    """A bare run row in a chosen state (tests of transitions; the runtime makes real ones)."""

    class Meta:
        model = AgentRun

    configuration = factory.SubFactory(AgentConfigurationFactory)
    prompt = "hello"
    status = Status.QUEUED

    class Params:
        waiting = factory.Trait(
            status=Status.WAITING_FOR_APPROVAL,
            lease_epoch=1,
            pending_turn=factory.LazyFunction(
                lambda: {
                    "kind": "approval",
                    "calls": [
                        {
                            "id": "call_0_0",
                            "name": "create_note",
                            "arguments": {"title": "t", "body": "b"},
                            "effect": "non_idempotent_write",
                        }
                    ],
                    "turn_digest": "d" * 64,
                }
            ),
        )
        completed = factory.Trait(status=Status.COMPLETED, termination_reason="completed")
