from django.db import models


class Note(models.Model):
    """A small record the sample tools read and write."""

    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    # The idempotency key of the create_note call that made it (``<run uuid>:<call id>``): its
    # check looks it up to tell whether an in-doubt call landed. Null for notes made otherwise.
    idempotency_key = models.CharField(
        max_length=255, null=True, blank=True, unique=True, editable=False
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        # The playground's own permissions; they live on Note because Django ties every
        # permission to a model's content type. ``use_playground``: staff also need it to open
        # the pages. ``approve_webhooks``: the ``approve_permission`` of ``call_webhook``.
        permissions = [
            ("use_playground", "Can use the tool playground"),
            ("approve_webhooks", "Can approve calls of call_webhook"),
        ]

    def __str__(self) -> str:
        return self.title
