"""A chart's numbers drawn as inline SVG by pygal, on the server.

pygal builds the SVG as an XML tree and its serializer escapes every text and attribute, so a
label chosen by a user (a configuration's name, a verdict read from an event) arrives as text.
Before serializing, the tree loses what a page must not carry: pygal's ``<script>`` elements
(its configuration object; its tooltip script would come from a CDN, ``js=[]`` already drops
that one) and its comments (they name its web site). What is left is markup and CSS: no
JavaScript runs and nothing is fetched. ``render`` is the one place the result is marked safe.
"""

from __future__ import annotations

import math
from typing import Any

import pygal
from django.utils.safestring import SafeString, mark_safe
from pygal.etree import etree
from pygal.style import Style

from agentruns.dashboard.series import ChartData

# Colours with contrast on white, in the order of the series; words (the legend, the table)
# always say what a colour means.
COLOURS = ("#1b6e3a", "#b3261e", "#5f6368", "#1a5fb4", "#8a4b00", "#6a3d9a", "#00707a")
NAMED_COLOURS = {
    "completed": "#1b6e3a",
    "failed": "#b3261e",
    "cancelled": "#5f6368",
    "requeued": "#1a5fb4",
    "dead_lettered": "#b3261e",
    "in_doubt": "#8a4b00",
    "approval": "#1a5fb4",
    "input": "#6a3d9a",
    "reconciliation": "#8a4b00",
    "median": "#1a5fb4",
    "95th percentile": "#6a3d9a",
}
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"

KINDS = {"stacked": pygal.StackedBar, "bar": pygal.Bar, "line": pygal.Line}


def _style(names: list[str]) -> Style:
    spare = iter(c for c in COLOURS if c not in {NAMED_COLOURS.get(n) for n in names})
    colours = tuple(NAMED_COLOURS.get(name) or next(spare, "#333333") for name in names)
    return Style(
        background="transparent",
        plot_background="#ffffff",
        foreground="#1f1f1f",
        foreground_strong="#000000",
        foreground_subtle="#444444",
        colors=colours,
        opacity=".9",
        opacity_hover="1",
        font_family=FONT,
        label_font_family=FONT,
        major_label_font_family=FONT,
        value_font_family=FONT,
        value_label_font_family=FONT,
        tooltip_font_family=FONT,
        title_font_family=FONT,
        legend_font_family=FONT,
        no_data_font_family=FONT,
        label_font_size=13,
        major_label_font_size=13,
        legend_font_size=14,
        no_data_font_size=28,
    )


def _strip(tree: Any) -> None:
    """Remove every ``<script>`` element and every comment (or processing instruction)."""
    for parent in list(tree.iter()):
        for child in list(parent):
            tag = child.tag
            if callable(tag) or (isinstance(tag, str) and tag.rsplit("}", 1)[-1] == "script"):
                parent.remove(child)


def _whole_ticks(data: ChartData, *, stacked: bool) -> list[int] | None:
    """Whole-number ticks for counts (no "0.4 runs"); ``None`` when a value is fractional."""
    numbers = [v for s in data.series for v in s.values if v is not None]
    if data.empty or any(v != int(v) for v in numbers):
        return None
    columns = zip(*(s.values for s in data.series), strict=True)
    top = max(
        (sum(v or 0 for v in column) if stacked else max(v or 0 for v in column))
        for column in columns
    )
    step = max(1, math.ceil(top / 5))
    return list(range(0, int(top) + step + 1, step))


def render(data: ChartData, *, kind: str, label: str) -> SafeString:
    """The SVG of ``data`` as a bar, stacked-bar or line chart, sized by its container.

    ``label`` (what the chart shows, in words) becomes the SVG's accessible name; the numbers
    themselves are given as a table next to it by the page."""
    names = [s.name for s in data.series]
    chart = KINDS[kind](
        y_labels=_whole_ticks(data, stacked=kind == "stacked"),
        js=[],
        disable_xml_declaration=True,
        style=_style(names),
        width=800,
        height=360,
        show_legend=bool(names),
        legend_at_bottom=True,
        legend_at_bottom_columns=min(len(names), 4) or 1,
        x_label_rotation=0 if len(data.x_labels) <= 7 else 40,
        show_minor_x_labels=len(data.x_labels) <= 14,
        x_labels_major_every=3 if len(data.x_labels) > 14 else None,
        truncate_label=-1,
        y_title=data.unit,
        print_zeroes=False,
        include_x_axis=True,
        min_scale=2,
        max_scale=6,
        truncate_legend=-1,
        no_data_text="nothing yet",
        margin=12,
    )
    chart.x_labels = data.x_labels
    if not data.empty:
        for series in data.series:
            chart.add(series.name, series.values)
    tree = chart.render_tree()
    _strip(tree)
    tree.set("role", "img")
    tree.set("aria-label", label)
    tree.set("focusable", "false")
    return mark_safe(etree.tostring(tree, encoding="unicode"))  # serialized by etree: escaped
