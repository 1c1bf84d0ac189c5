"""Template helpers of the console: relative times with the exact time on hover, badges."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """``12 s ago`` / ``in 40 s`` / ``3 min ago`` / ``2 h ago`` / ``4 d ago``."""
    if moment is None:
        return "never"
    delta = ((now or timezone.now()) - moment).total_seconds()
    future, seconds = delta < 0, abs(delta)
    if seconds < 120:
        text = f"{seconds:.0f} s"
    elif seconds < 7200:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 172800:
        text = f"{seconds / 3600:.0f} h"
    else:
        text = f"{seconds / 86400:.0f} d"
    return f"in {text}" if future else f"{text} ago"


def ago_html(moment: datetime | None):
    if moment is None:
        return format_html('<span class="console-ago">never</span>')
    exact = timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")
    return format_html(
        '<time class="console-ago" datetime="{}" title="{}">{}</time>',
        moment.isoformat(),
        exact,
        relative(moment),
    )


@register.filter
def ago(moment: datetime | None):
    return ago_html(moment)


@register.filter
def percent(value: float) -> str:
    return f"{value * 100:.1f} %"


@register.filter
def ms(value: float | None) -> str:
    return "—" if value is None else (f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms")


@register.filter
def nbytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)
