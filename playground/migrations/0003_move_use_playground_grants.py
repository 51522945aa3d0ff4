"""Move the grants of ``agentruns.use_playground`` to ``playground.use_playground``.

The permission used to be declared on ``agentruns.AgentRun``; it is the playground's own and is
now declared on ``playground.Note`` (0002). Forward: every user and group that holds the old
permission gets the new one, then the old permission (declared by no model any more) is deleted.
Backward: the old permission is recreated and every holder of the new one gets it back.

Permissions are normally created by ``post_migrate``, after every migration has run, so each
direction creates the permission it copies to when it does not exist yet. With nothing to copy
(a fresh database) nothing is written.
"""

from django.conf import settings
from django.db import migrations

CODENAME = "use_playground"
NAME = "Can use the tool playground"
OLD = ("agentruns", "agentrun")
NEW = ("playground", "note")


def _find(apps, alias, owner):
    Permission = apps.get_model("auth", "Permission")
    app_label, model = owner
    return (
        Permission.objects.using(alias)
        .filter(content_type__app_label=app_label, content_type__model=model, codename=CODENAME)
        .first()
    )


def _get_or_create(apps, alias, owner):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    app_label, model = owner
    content_type, _ = ContentType.objects.using(alias).get_or_create(
        app_label=app_label, model=model
    )
    permission, _ = Permission.objects.using(alias).get_or_create(
        content_type=content_type, codename=CODENAME, defaults={"name": NAME}
    )
    return permission


def _copy_grants(source, target):
    """Give ``target`` to every user and group holding ``source`` (existing grants are kept)."""
    target.group_set.add(*source.group_set.all())
    if hasattr(source, "user_set"):  # a custom user model may have no user_permissions
        target.user_set.add(*source.user_set.all())


def forward(apps, schema_editor):
    alias = schema_editor.connection.alias
    old = _find(apps, alias, OLD)
    if old is None:
        return
    _copy_grants(old, _get_or_create(apps, alias, NEW))
    old.delete()


def backward(apps, schema_editor):
    alias = schema_editor.connection.alias
    new = _find(apps, alias, NEW)
    if new is None:
        return
    _copy_grants(new, _get_or_create(apps, alias, OLD))


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0002_note_use_playground"),
        ("agentruns", "0003_agentrun_without_use_playground"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(forward, backward)]
