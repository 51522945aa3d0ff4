"""The ledger's format and key per event (agentruns.ledger): events chained before this keep
their hashes and are marked version 1 (their hash covers neither ``created_at`` nor
``duration_ms``); every event written from now on is version 2. Nothing is re-chained: a chain
re-signed now would vouch for whatever was in the table when it ran."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("agentruns", "0021_agentrun_start_permission")]

    operations = [
        # Existing rows get 1, then new rows default to 2 (the writer always writes it).
        migrations.AddField(
            model_name="agentrunevent",
            name="ledger_version",
            field=models.PositiveSmallIntegerField(default=1, editable=False),
        ),
        migrations.AlterField(
            model_name="agentrunevent",
            name="ledger_version",
            field=models.PositiveSmallIntegerField(default=2, editable=False),
        ),
        migrations.AddField(
            model_name="agentrunevent",
            name="ledger_key",
            field=models.CharField(blank=True, default="", editable=False, max_length=16),
        ),
    ]
