"""The notifications page (admins only): channels per event kind, every notice and each of
its tries, and the buttons to add or remove a channel and to send a test notice.

Each action is a POST with CSRF and a reason, audited by ``console.drivers.notifications``; a test
notice goes through the outbox like every other, so the page shows its tries as they land.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.validators import validate_email
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.drivers import notifications
from console.models import ChannelTransport, NoticeKind
from console.records.roles import Capability, can
from console.tasks import deliver_notice
from console.web.forms import REASON_HELP
from console.web.views import _can, _person, requires


def navigation(request: HttpRequest) -> dict[str, bool]:
    """Template context: whether the navigation offers the notifications page."""
    user = getattr(request, "user", None)
    return {"may_manage_notifications": user is not None and can(user, Capability.NOTIFY)}


class ReasonForm(forms.Form):
    """A reason for the audit log, which every action here needs."""

    reason = forms.CharField(
        max_length=4000, widget=forms.Textarea(attrs={"rows": 2}), help_text=REASON_HELP
    )


class ChannelForm(ReasonForm):
    """A new channel: a webhook (URL and secret) or email addresses, and the kinds it gets.
    What each kind needs filled in is its transport's (``notifications.TRANSPORTS``)."""

    field_order = ["name", "transport", "url", "secret", "address", "kinds", "reason"]
    name = forms.CharField(max_length=100)
    transport = forms.ChoiceField(choices=ChannelTransport.choices, widget=forms.RadioSelect)
    url = forms.URLField(
        max_length=2000,
        required=False,
        assume_scheme="https",
        label="Webhook URL",
        help_text="An https:// address on the internet, without a user name or password; a "
        "Slack-compatible incoming webhook takes the notices as they are.",
    )
    secret = forms.CharField(
        max_length=200,
        required=False,
        min_length=16,
        widget=forms.PasswordInput(render_value=False),
        help_text="Signs each webhook body; leave empty to have one made (shown once).",
    )
    address = forms.CharField(
        max_length=1000, required=False, label="Email addresses", help_text="Comma-separated."
    )
    kinds = forms.MultipleChoiceField(
        choices=NoticeKind.choices, widget=forms.CheckboxSelectMultiple, label="Tell about"
    )

    def clean_address(self) -> str:
        addresses = [a.strip() for a in self.cleaned_data["address"].split(",") if a.strip()]
        for address in addresses:
            validate_email(address)
        return ", ".join(addresses)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        transport = notifications.TRANSPORTS.get(data.get("transport", ""))
        for field, missing in transport.asks.items() if transport else ():
            if not data.get(field):
                self.add_error(field, missing)
        return data


def _page(
    request: HttpRequest,
    form: ChannelForm | None = None,
    *,
    made_secret: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "page": notifications.notifications_page(),
        "form": form or ChannelForm(),
        "made_secret": made_secret,
        "can": _can(request),
    }
    return render(request, "console/notifications.html", context, status=status)


@require_GET
@requires(Capability.NOTIFY)
def notifications_page(request: HttpRequest) -> HttpResponse:
    """The channels, the latest notices and their tries."""
    return _page(request)


@require_POST
@requires(Capability.NOTIFY)
def channel_add(request: HttpRequest) -> HttpResponse:
    """Add a channel; a secret made here is shown on the answer, once."""
    form = ChannelForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    try:
        channel, made = notifications.channel_add(
            actor=_person(request),
            reason=data["reason"],
            name=data["name"],
            transport=data["transport"],
            kinds=data["kinds"],
            url=data["url"],
            address=data["address"],
            secret=data["secret"],
        )
    except notifications.NotificationError as exc:
        form.add_error(exc.field, str(exc))  # a refused target beside its field
        return _page(request, form, status=400)
    if made:
        # Rendered, not redirected: a message would keep the secret in the session.
        return _page(request, made_secret=made)
    messages.success(request, f"Channel {channel.name} added.")
    return redirect("notifications")


def _act(request: HttpRequest, channel_id: int, *, test: bool) -> HttpResponse:
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.warning(request, "Say why: the reason goes to the audit log.")
        return _page(request, status=400)
    try:
        if test:
            notice = notifications.channel_send_test(
                actor=_person(request), reason=form.cleaned_data["reason"], channel_id=channel_id
            )
        else:
            channel = notifications.channel_remove(
                actor=_person(request), reason=form.cleaned_data["reason"], channel_id=channel_id
            )
    except notifications.NotificationError as exc:
        messages.warning(request, str(exc))
        return redirect("notifications")
    if test:
        deliver_notice.delay(notice.id)
        messages.success(request, f"Test notice {notice.id} queued: its tries show below.")
    else:
        messages.success(request, f"Channel {channel.name} removed.")
    return redirect("notifications")


@require_POST
@requires(Capability.NOTIFY)
def channel_test(request: HttpRequest, channel_id: int) -> HttpResponse:
    """Queue a test notice to one channel (audited)."""
    return _act(request, channel_id, test=True)


@require_POST
@requires(Capability.NOTIFY)
def channel_remove(request: HttpRequest, channel_id: int) -> HttpResponse:
    """Turn a channel off (audited); its notices stay listed."""
    return _act(request, channel_id, test=False)
