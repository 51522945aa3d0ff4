"""``/``, the project's front door: it sends each person where their work is. Anyone who may use
the playground goes there; a reviewer (``agentruns.decide_agentrun``) to the approvals inbox;
other staff to the admin; anyone else to the admin's login page, which brings them back here
once signed in."""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse

from agentruns.authority import DECIDE_PERMISSION
from playground.views import may_use_playground


def front_door(request: HttpRequest) -> HttpResponseRedirect:
    user = request.user
    if may_use_playground(user):
        return redirect("playground:index")
    if user.is_active and user.is_staff:
        return redirect("approvals:inbox" if user.has_perm(DECIDE_PERMISSION) else "admin:index")
    return redirect_to_login(request.get_full_path(), reverse("admin:login"))
