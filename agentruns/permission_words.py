"""Permissions in words, for the pages that refuse something: each permission an ``Authority``
lacks, by the name people grant it under (*Can approve calls of call_webhook*) and the groups
that hold it, so a reader knows whom to ask.

``authority_permissions(authority)`` lists what ``authority.missing`` names; the screens show
it under the refusal (``{% permissions_in_words authority %}`` in the ``leasehold`` tags). Read
only: one query for any number of permissions (their names and the groups holding them).
Superusers hold every permission (``has_perm``), which each sentence says too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import Permission
from django.db.models import Q

from agentruns.authority import Authority


@dataclass(frozen=True)
class PermissionInWords:
    """``permission`` (``app_label.codename``), its ``name`` ("" when no such permission is
    installed) and the names of the groups holding it."""

    permission: str
    name: str
    groups: tuple[str, ...]

    def sentence(self) -> str:
        """ "“Can approve calls of call_webhook” (playground.approve_webhooks) is held by the
        group Release managers, and by every superuser." """
        named = f"“{self.name}” ({self.permission})" if self.name else self.permission
        if not self.groups:
            held = "is held by no group: only by superusers and by whoever it is given to"
        else:
            quoted = ", ".join(f"“{group}”" for group in self.groups)
            held = f"is held by the group{'s' if len(self.groups) > 1 else ''} {quoted}"
            held += ", and by every superuser"
        return f"{named} {held}."


def permissions_in_words(permissions: Iterable[str]) -> list[PermissionInWords]:
    """Each of ``permissions`` (``app_label.codename``) in words, in the order given: one
    query (each permission joined to the groups holding it)."""
    wanted = list(dict.fromkeys(permissions))
    if not wanted:
        return []
    match = Q()
    for permission in wanted:
        app_label, _, codename = permission.partition(".")
        match |= Q(content_type__app_label=app_label, codename=codename)
    names: dict[str, str] = {}
    groups: dict[str, list[str]] = {}
    rows = (
        Permission.objects.filter(match)
        .values_list("content_type__app_label", "codename", "name", "group__name")
        .order_by("group__name")
    )
    for app_label, codename, name, group in rows:
        key = f"{app_label}.{codename}"
        names[key] = name
        if group is not None:
            groups.setdefault(key, []).append(group)
    return [
        PermissionInWords(p, names.get(p, ""), tuple(dict.fromkeys(groups.get(p, []))))
        for p in wanted
    ]


def authority_permissions(authority: Authority | None) -> list[PermissionInWords]:
    """The permissions ``authority`` checked that its missing pieces name, in words (none when
    nothing is missing; a missing group membership is named by the refusal itself)."""
    if authority is None or authority.allowed:
        return []
    return permissions_in_words(
        p for p in authority.permissions if any(p in missing for missing in authority.missing)
    )
