"""The overview's plots as inline SVG, drawn on the server: no chart library, no script, nothing fetched.

Each function returns markup whose only text (labels) went through :func:`html.escape`.
"""

from __future__ import annotations

import math
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 360, 180, 28
MAX_POINTS = 2000  # a scatter of 100,000 rollouts shows a regular sample of them


def _frame(title: str, body: str, x_label: str, y_label: str) -> Markup:
    return Markup(
        f'<figure class="plot"><figcaption>{escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - 4}" y2="{HEIGHT - PAD}" class="axis"/>'
        f'<line x1="{PAD}" y1="4" x2="{PAD}" y2="{HEIGHT - PAD}" class="axis"/>'
        f"{body}"
        f'<text x="{WIDTH // 2}" y="{HEIGHT - 4}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text x="10" y="{HEIGHT // 2}" text-anchor="middle" transform="rotate(-90 10 {HEIGHT // 2})">'
        f"{escape(y_label)}</text></svg></figure>"
    )


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def bars(title: str, labels: list[str], values: list[float], x_label: str, y_label: str) -> Markup:
    """One bar per label, heights scaled to the largest value (at least 1)."""
    if not values:
        return _frame(title, _empty(), x_label, y_label)
    top = max(max(values), 1e-9)
    span = (WIDTH - PAD - 8) / len(values)
    parts = []
    for k, (label, value) in enumerate(zip(labels, values, strict=True)):
        height = (HEIGHT - 2 * PAD) * value / top
        x = PAD + 2 + k * span
        parts.append(
            f'<rect x="{x:.1f}" y="{HEIGHT - PAD - height:.1f}" width="{max(span - 2, 1):.1f}" '
            f'height="{height:.1f}"><title>{escape(label)}: {escape(_fmt(value))}</title></rect>'
        )
    if len(labels) <= 12:
        for k, label in enumerate(labels):
            x = PAD + 2 + (k + 0.5) * span
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - PAD + 11}" text-anchor="middle" class="tick">'
                         f"{escape(label)}</text>")  # fmt: skip
    parts.append(f'<text x="{PAD + 2}" y="12" class="tick">max {escape(_fmt(top))}</text>')
    return _frame(title, "".join(parts), x_label, y_label)


def histogram(title: str, values: list[float], x_label: str, bins: int = 10) -> Markup:
    """Counts of ``values`` in equal-width bins (one bin per value when there are few distinct values)."""
    if not values:
        return bars(title, [], [], x_label, "rollouts")
    distinct = sorted(set(values))
    if len(distinct) <= bins:
        counts = [float(values.count(v)) for v in distinct] if len(values) < 50_000 else _count(values, distinct)
        return bars(title, [_fmt(v) for v in distinct], counts, x_label, "rollouts")
    low, high = distinct[0], distinct[-1]
    width = (high - low) / bins
    counts = [0.0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    labels = [_fmt(low + k * width) for k in range(bins)]
    return bars(title, labels, counts, x_label, "rollouts")


def _count(values: list[float], distinct: list[float]) -> list[float]:
    totals = dict.fromkeys(distinct, 0.0)
    for value in values:
        totals[value] += 1
    return [totals[v] for v in distinct]


def scatter(title: str, xs: list[float], ys: list[float], x_label: str, y_label: str) -> Markup:
    """Points (x, y), at most :data:`MAX_POINTS` of them (every k-th)."""
    if not xs:
        return _frame(title, _empty(), x_label, y_label)
    step = max(1, math.ceil(len(xs) / MAX_POINTS))
    xs, ys = xs[::step], ys[::step]
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(ys), max(ys)
    x_span, y_span = (x_high - x_low) or 1.0, (y_high - y_low) or 1.0
    points = "".join(
        f'<circle cx="{PAD + 4 + (x - x_low) / x_span * (WIDTH - PAD - 12):.1f}" '
        f'cy="{HEIGHT - PAD - 4 - (y - y_low) / y_span * (HEIGHT - 2 * PAD - 8):.1f}" r="2"/>'
        for x, y in zip(xs, ys, strict=True)
    )
    ticks = (
        f'<text x="{PAD + 2}" y="{HEIGHT - PAD + 11}" class="tick">{escape(_fmt(x_low))}</text>'
        f'<text x="{WIDTH - 6}" y="{HEIGHT - PAD + 11}" text-anchor="end" class="tick">{escape(_fmt(x_high))}</text>'
        f'<text x="{PAD + 2}" y="12" class="tick">{escape(y_label)} {escape(_fmt(y_low))}..{escape(_fmt(y_high))}'
        f"</text>"
    )
    return _frame(title, points + ticks, x_label, y_label)


def _empty() -> str:
    return f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle">no rollouts yet</text>'
