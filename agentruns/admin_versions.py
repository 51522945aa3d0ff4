"""The admin's window on configuration versions (docs/configuration-versions.md): read-only, listed
on their configuration's page (``versions_table``) and on their own, and the diff between two.

Versions are written only by ``agentruns.services.versions``; nothing here adds, changes or
deletes one. The diff page checks the view permission on versions per request (the admin site
checks staff), reads both versions by id and shows ``agentruns.versions.diff_lines`` escaped by
the template.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join

from agentruns import versions
from agentruns.models import AgentConfiguration, ConfigurationVersion


def diff_url(old: ConfigurationVersion | None, new: ConfigurationVersion) -> str:
    """The diff page of ``old`` → ``new`` (``old`` ``None``: against nothing, the whole of it)."""
    url = reverse("admin:agentruns_configurationversion_diff")
    return f"{url}?a={old.pk if old is not None else ''}&b={new.pk}"


def _previous(version: ConfigurationVersion) -> ConfigurationVersion | None:
    return (
        ConfigurationVersion.objects.filter(
            configuration_id=version.configuration_id, number__lt=version.number
        )
        .order_by("-number")
        .first()
    )


def versions_table(configuration: AgentConfiguration) -> str:
    """The configuration's versions, newest first, each with its author, hash and a link to
    its diff against the one before (an unsaved configuration: none yet)."""
    if configuration.pk is None:
        return "—"
    rows = list(
        ConfigurationVersion.objects.filter(configuration_id=configuration.pk)
        .select_related("created_by")
        .order_by("-number")
    )
    older: list[ConfigurationVersion | None] = [*rows[1:], None]
    body = format_html_join(
        "",
        '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td><code>{}</code></td>'
        '<td><a href="{}">{}</a></td></tr>',
        (
            (
                reverse("admin:agentruns_configurationversion_change", args=[version.pk]),
                version.label,
                date_format(version.created_at, "DATETIME_FORMAT"),
                version.created_by.get_username() if version.created_by else "—",
                version.content_hash[:12],
                diff_url(previous, version),
                f"diff {previous.label} → {version.label}" if previous else "the whole version",
            )
            for version, previous in zip(rows, older, strict=True)
        ),
    )
    return format_html(
        '<table class="lh-versions"><thead><tr><th scope="col">version</th>'
        '<th scope="col">made</th><th scope="col">by</th><th scope="col">content hash</th>'
        '<th scope="col">changes</th></tr></thead><tbody>{}</tbody></table>',
        body,
    )


@admin.register(ConfigurationVersion)
class ConfigurationVersionAdmin(admin.ModelAdmin):
    """Read-only: every version of every configuration, its snapshot, and the diff of two."""

    list_display = ["configuration", "label", "created_at", "created_by", "short_hash"]
    list_filter = ["configuration"]
    list_select_related = ["configuration", "created_by"]
    fields = ("configuration", "label", "created_at", "created_by", "content_hash", "shown")
    readonly_fields = (
        "configuration",
        "label",
        "created_at",
        "created_by",
        "content_hash",
        "shown",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    @admin.display(description="version", ordering="number")
    def label(self, version: ConfigurationVersion) -> str:
        return version.label

    @admin.display(description="content hash")
    def short_hash(self, version: ConfigurationVersion) -> str:
        return version.content_hash[:12]

    @admin.display(description="snapshot")
    def shown(self, version: ConfigurationVersion) -> str:
        previous = _previous(version)
        link = format_html(
            '<p><a href="{}">{}</a></p>',
            diff_url(previous, version),
            f"diff {previous.label} → {version.label}" if previous else "the whole version",
        )
        return format_html(
            '{}<pre class="lh-json">{}</pre>', link, versions.pretty(version.snapshot)
        )

    def get_urls(self) -> list[URLPattern]:
        diff = path(
            "diff/",
            self.admin_site.admin_view(self.diff_view),
            name="agentruns_configurationversion_diff",
        )
        return [diff, *super().get_urls()]

    def diff_view(self, request: HttpRequest) -> HttpResponse:
        """``?a=<id>&b=<id>``: the unified diff of version ``a``'s pretty JSON to ``b``'s
        (``a`` empty: against nothing). Staff (the admin site) with the view permission on
        versions, checked here on every request; an unknown or malformed id is a 404."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        new = self._version(request.GET.get("b"))
        if new is None:
            raise Http404("no such version")
        old = self._version(request.GET.get("a")) if request.GET.get("a") else None
        lines = versions.diff_lines(
            old.snapshot if old is not None else {},
            new.snapshot,
            old_label=_name(old) if old is not None else "(nothing)",
            new_label=_name(new),
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Changes: {_name(old) if old else '(nothing)'} → {_name(new)}",
            "old": old,
            "new": new,
            "lines": [(_line_class(line), line) for line in lines],
        }
        return TemplateResponse(request, "admin/agentruns/configurationversion/diff.html", context)

    def _version(self, raw: str | None) -> ConfigurationVersion | None:
        if not raw or not raw.isdigit():
            if raw:
                raise Http404("no such version")
            return None
        version = (
            ConfigurationVersion.objects.select_related("configuration").filter(pk=raw).first()
        )
        if version is None:
            raise Http404("no such version")
        return version


def _name(version: ConfigurationVersion) -> str:
    return f"{version.configuration.slug} {version.label}"


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "lh-diff-file"
    if line.startswith("@@"):
        return "lh-diff-hunk"
    if line.startswith("+"):
        return "lh-diff-added"
    if line.startswith("-"):
        return "lh-diff-removed"
    return "lh-diff-same"
