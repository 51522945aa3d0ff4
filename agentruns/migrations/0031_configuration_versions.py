"""Configuration versions (docs/configuration-versions.md): the table, version 1 of every
existing configuration, every existing run pinned to it, then the run's column made NOT NULL.

The data step computes the snapshot with its own copy of the pinned fields and their canonical
JSON (what ``agentruns.versions`` did when this migration was written), so that later changes to
that module cannot change what this migration writes. It runs on SQLite and PostgreSQL alike
(plain ORM reads and writes, one UPDATE per configuration for its runs).
"""

import hashlib
import json
from datetime import timedelta
from decimal import Decimal

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils.duration import duration_iso_string

PINNED_FIELDS = (
    "provider",
    "model",
    "base_url",
    "api_key_env",
    "timeout_seconds",
    "max_output_tokens",
    "system_prompt",
    "tools",
    "max_iterations",
    "script",
    "output_schema",
    "require_second_approver",
    "preview_is_snapshot",
    "allow_chat_approval",
    "approval_timeout",
    "on_approval_timeout",
    "escalation_timeout",
    "on_escalation_timeout",
    "price_per_million_prompt_tokens",
    "price_per_million_completion_tokens",
    "max_tokens_per_call",
)
DECIMAL_PLACES = 6  # both price columns


def _to_json(value):
    if isinstance(value, Decimal):
        return format(value.quantize(Decimal(1).scaleb(-DECIMAL_PLACES)), "f")
    if isinstance(value, timedelta):
        return duration_iso_string(value)
    return value


def version_one_for_all(apps, schema_editor):
    Configuration = apps.get_model("agentruns", "AgentConfiguration")
    Version = apps.get_model("agentruns", "ConfigurationVersion")
    Run = apps.get_model("agentruns", "AgentRun")
    for configuration in Configuration.objects.order_by("pk").iterator():
        snapshot = {name: _to_json(getattr(configuration, name)) for name in PINNED_FIELDS}
        text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        version = Version.objects.create(
            configuration_id=configuration.pk,
            number=1,
            snapshot=snapshot,
            content_hash=hashlib.sha256(text.encode()).hexdigest(),
        )
        Run.objects.filter(configuration_id=configuration.pk).update(config_version_id=version.pk)
    if schema_editor.connection.vendor == "postgresql":
        # The foreign key checks are deferred: run them now, so that the ALTER that follows in
        # this transaction meets no pending trigger events.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0030_standing_approvals"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ConfigurationVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveIntegerField()),
                ("snapshot", models.JSONField()),
                ("content_hash", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "configuration",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="versions",
                        to="agentruns.agentconfiguration",
                    ),
                ),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["configuration", "-number"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("configuration", "number"),
                        name="configurationversion_unique_number",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="agentrun",
            name="config_version",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="runs",
                to="agentruns.configurationversion",
            ),
        ),
        migrations.RunPython(version_one_for_all, migrations.RunPython.noop, elidable=False),
        migrations.AlterField(
            model_name="agentrun",
            name="config_version",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="runs",
                to="agentruns.configurationversion",
            ),
        ),
    ]
