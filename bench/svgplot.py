"""A line chart as a standalone SVG file, for docs/img/: no plotting library to install."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 860, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 90
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dashed: bool = False


def _nice_step(span: float, ticks: int = 6) -> float:
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))


def line_chart(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    xs = [x for s in series for x, _ in s.points] or [0.0, 1.0]
    ys = [y for s in series for _, y in s.points] or [0.0, 1.0]
    x_max = max(xs) or 1.0
    y_step = _nice_step(max(ys))
    y_max = y_step * math.ceil(max(ys) / y_step) or 1.0
    x_step = _nice_step(x_max)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + w * x / x_max

    def py(y: float) -> float:
        return TOP + h * (1 - y / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    y = 0.0
    while y <= y_max + 1e-9:
        out.append(
            f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + w}" y2="{py(y):.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>'
        )
        y += y_step
    x = 0.0
    while x <= x_max + 1e-9:
        out.append(
            f'<text x="{px(x):.1f}" y="{TOP + h + 16}" text-anchor="middle">{x:g}</text>'
        )
        x += x_step
    out.append(
        f'<line x1="{LEFT}" y1="{TOP + h}" x2="{LEFT + w}" y2="{TOP + h}" stroke="black"/>'
    )
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + h}" stroke="black"/>')
    out.append(
        f'<text x="{LEFT + w / 2}" y="{TOP + h + 34}" text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text x="16" y="{TOP + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + h / 2})">{escape(y_label)}</text>'
    )
    for at, label in marks:
        out.append(
            f'<line x1="{px(at):.1f}" y1="{TOP}" x2="{px(at):.1f}" y2="{TOP + h}" '
            f'stroke="#888" stroke-dasharray="2,3"/>'
        )
        out.append(f'<text x="{px(at) + 3:.1f}" y="{TOP + 12}" fill="#555">{escape(label)}</text>')
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        ly = TOP + h + 52 + 16 * (i // 2)
        lx = LEFT + (i % 2) * (w / 2)
        out.append(
            f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 30}" y="{ly}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
