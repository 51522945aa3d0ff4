"""Small HTML inspections for the inbox's accessibility checks (standard library parser)."""

from __future__ import annotations

import html as htmllib
import re
from html.parser import HTMLParser
from itertools import pairwise

FIELD_TAGS = {"input", "select", "textarea"}
UNLABELLED_TYPES = {"hidden", "submit", "button", "reset", "image"}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.headings: list[int] = []
        self.fields: list[dict[str, str | None]] = []
        self.label_targets: set[str] = set()
        self.forms: list[dict[str, str | None]] = []
        self.buttons: list[dict[str, str | None]] = []
        self.in_main = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag in {"h1", "h2", "h3", "h4", "h5", "h6"}:
            self.headings.append(int(tag[1]))
        elif tag in FIELD_TAGS:
            if (attributes.get("type") or "text") not in UNLABELLED_TYPES:
                self.fields.append(attributes)
        elif tag == "label" and attributes.get("for"):
            self.label_targets.add(attributes["for"])
        elif tag == "form":
            self.forms.append(attributes)
        elif tag == "button":
            self.buttons.append(attributes)


def inspect(html: str) -> _Collector:
    collector = _Collector()
    collector.feed(html)
    return collector


def content_of(html: str) -> str:
    """The admin page's content area (the part the inbox renders)."""
    start = html.index('<div id="content"')
    return html[start : html.index('<footer id="footer"')]


def heading_levels(html: str) -> list[int]:
    return inspect(content_of(html)).headings


def headings_in_order(levels: list[int]) -> bool:
    """Starts at h1 and never skips a level going down."""
    if not levels or levels[0] != 1:
        return False
    return all(b <= a + 1 for a, b in pairwise(levels))


def unlabelled_fields(html: str) -> list[dict[str, str | None]]:
    page = inspect(content_of(html))
    return [f for f in page.fields if f.get("id") not in page.label_targets]


# Every message after a decision leads with its run: "Run 7b7e07e3 (Notes): …" (a link).
RUN_NAMED = re.compile(
    r"^Run (?P<short>[0-9a-f]{8})(?: \((?P<configuration>.*?)\))?: (?P<rest>.*)$"
)


def message_text(message: object) -> str:
    """A message as a reader sees it: its markup dropped, its entities read."""
    return htmllib.unescape(re.sub(r"<[^>]+>", "", str(message)))


def sentences(response) -> list[str]:
    """The messages of a response without the run each names (``RUN_NAMED``)."""
    texts = [message_text(m) for m in response.context["messages"]]
    return [match["rest"] if (match := RUN_NAMED.match(t)) else t for t in texts]


def named_runs(response) -> list[str]:
    """The short ids the response's messages lead with ("" for a message naming no run)."""
    texts = [message_text(m) for m in response.context["messages"]]
    return [match["short"] if (match := RUN_NAMED.match(t)) else "" for t in texts]
