"""Give ``agentruns.start_agentrun`` to every user and group holding ``playground.use_playground``.

Starting a run in the playground (and through the API) needs ``agentruns.start_agentrun`` from
``agentruns`` 0021 on; the developers who could start runs in the playground keep that. Backward:
nothing is taken away (the permission's rows go with ``agentruns`` 0021's reversal, if ever).

Permissions are normally created by ``post_migrate``, after every migration has run, so the
permission is created here when it does not exist yet. With nobody to grant it to (a fresh
database) nothing is written.
"""

from django.conf import settings
from django.db import migrations

SOURCE = ("playground", "note", "use_playground")
TARGET = ("agentruns", "agentrun", "start_agentrun", "Can start agent runs (the API, the playground)")


def forward(apps, schema_editor):
    alias = schema_editor.connection.alias
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    app_label, model, codename = SOURCE
    source = (
        Permission.objects.using(alias)
        .filter(content_type__app_label=app_label, content_type__model=model, codename=codename)
        .first()
    )
    if source is None:
        return
    groups = list(source.group_set.all())
    users = list(source.user_set.all()) if hasattr(source, "user_set") else []
    if not groups and not users:
        return
    app_label, model, codename, name = TARGET
    content_type, _ = ContentType.objects.using(alias).get_or_create(
        app_label=app_label, model=model
    )
    target, _ = Permission.objects.using(alias).get_or_create(
        content_type=content_type, codename=codename, defaults={"name": name}
    )
    target.group_set.add(*groups)
    if hasattr(target, "user_set"):  # a custom user model may have no user_permissions
        target.user_set.add(*users)


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0005_note_idempotency_key"),
        ("agentruns", "0021_agentrun_start_permission"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
