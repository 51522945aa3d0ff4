"""Template tags the interfaces share about tools: ``{% tool_origin call.name as origin %}``
(``agentruns.tools.origins``) for the include templates that show where a call's tool comes
from."""

from __future__ import annotations

from django import template

from agentruns.tools.origins import ToolOrigin
from agentruns.tools.origins import tool_origin as read_origin

register = template.Library()


@register.simple_tag
def tool_origin(name: str) -> ToolOrigin:
    return read_origin(str(name))
