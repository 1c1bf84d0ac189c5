"""Small server-rendered SVG charts (no JavaScript, no CDN): requests as bars, errors on top."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from console.selectors import Series


def bar_chart(
    series: Series, *, width: int = 720, height: int = 160, title: str = "requests per minute"
) -> SafeString:
    """Requests (blue) and errors (red) per step of ``series``; every value is a number."""
    n = max(len(series.requests), 1)
    pad_left, pad_bottom, pad_top = 40, 22, 12
    plot_w, plot_h = width - pad_left - 8, height - pad_bottom - pad_top
    top = max(max(series.requests, default=0), 1)
    step = plot_w / n
    bar_w = max(step * 0.8, 1.0)
    parts = [
        f'<svg class="console-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<line x1="{pad_left}" y1="{pad_top + plot_h}" x2="{width - 8}" '
        f'y2="{pad_top + plot_h}" stroke="#999"/>',
        f'<text x="{pad_left - 4}" y="{pad_top + 8}" text-anchor="end" font-size="10">{top}</text>',
        f'<text x="{pad_left - 4}" y="{pad_top + plot_h}" text-anchor="end" '
        f'font-size="10">0</text>',
    ]
    for i, (req, err) in enumerate(zip(series.requests, series.errors, strict=False)):
        x = pad_left + i * step + (step - bar_w) / 2
        label = f"{series.minutes[i]:%H:%M} UTC: {req} requests, {err} errors"
        if req:
            h = plot_h * req / top
            parts.append(
                f'<rect class="req" x="{x:.1f}" y="{pad_top + plot_h - h:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="#417690">'
                f"<title>{label}</title></rect>"
            )
        if err:
            h = plot_h * err / top
            parts.append(
                f'<rect class="err" x="{x:.1f}" y="{pad_top + plot_h - h:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="#ba2121">'
                f"<title>{label}</title></rect>"
            )
    if series.minutes:
        parts.append(
            f'<text x="{pad_left}" y="{height - 6}" font-size="10">'
            f"{series.minutes[0]:%m-%d %H:%M}</text>"
        )
        parts.append(
            f'<text x="{width - 8}" y="{height - 6}" text-anchor="end" font-size="10">'
            f"{series.minutes[-1]:%m-%d %H:%M} UTC</text>"
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only
