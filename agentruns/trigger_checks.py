"""Database system checks of what starts runs (``manage.py check --database default``, and
``migrate``): rows written around the admin's validation that could never work.

``agentruns.E060``: an enabled ``EventSource`` names a secret variable the secret rule refuses
(its endpoint stays off). ``agentruns.E061``: an enabled ``RunSchedule`` whose timing does not
parse (its ticks are skipped). Reads the two tables only, and nothing before they exist; never
reads a secret's value.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, register
from django.db import DatabaseError, connections

from agentruns import schedule_times


@register(Tags.database)
def check_triggers(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    from agentruns.models import EventSource, RunSchedule

    messages: list[CheckMessage] = []
    for alias in databases or ():
        try:
            if RunSchedule._meta.db_table not in connections[alias].introspection.table_names():
                continue  # not migrated yet
            messages += _sources(EventSource.objects.using(alias).filter(enabled=True))
            messages += _schedules(RunSchedule.objects.using(alias).filter(enabled=True))
        except DatabaseError:
            continue  # unreachable: Django's own checks report it
    return messages


def _sources(sources: Any) -> list[CheckMessage]:
    from agentruns.secrets import secret_env_problem

    return [
        Error(
            f"Events of {source.configuration.slug!r} are off: {problem}.",
            hint="Name a variable the secret rule allows (by default LEASEHOLD_…).",
            obj=source,
            id="agentruns.E060",
        )
        for source in sources.select_related("configuration")
        if (problem := secret_env_problem(source.secret_env)) is not None
    ]


def _schedules(schedules: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for schedule in schedules:
        problem = schedule_times.timing_problem(**schedule.timing())
        if problem is not None:
            messages.append(
                Error(
                    f"Schedule {schedule.name!r} cannot be followed: {problem}",
                    hint="Correct it in the admin, or disable it.",
                    obj=schedule,
                    id="agentruns.E061",
                )
            )
    return messages
