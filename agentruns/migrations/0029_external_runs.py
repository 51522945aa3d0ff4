from django.db import migrations, models

TERMINATION_REASONS = [
    ("completed", "completed"),
    ("max_iterations", "reached the round cap"),
    ("provider_failed", "the provider failed"),
    ("tool_failed", "a tool failed"),
    ("not_retryable", "failed with an error that is not retried"),
    ("retries_exhausted", "used its whole retry budget"),
    ("not_resumable", "its stored state could not be rehydrated"),
    ("abandoned", "the client went away mid-stream"),
    ("reconciled_abandoned", "abandoned by an operator during reconciliation"),
    ("cancelled", "cancelled"),
    ("internal_error", "an unexpected error inside Leasehold"),
    ("approval_expired", "nobody decided before its approval deadline"),
    ("budget_exhausted", "its daily budget was spent"),
    ("bad_response", "the provider's reply was malformed or could not be stored"),
    ("bad_output", "its final answer did not match the output schema"),
    ("external_failed", "its external agent loop reported a failure"),
]


class Migration(migrations.Migration):

    dependencies = [
        ("agentruns", "0028_schedules_and_events"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentrun",
            name="external_framework",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="agentrun",
            name="external_state",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="agentrun",
            name="termination_reason",
            field=models.CharField(
                blank=True,
                choices=TERMINATION_REASONS,
                max_length=32,
            ),
        ),
    ]
