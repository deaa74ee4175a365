"""How the benchmarks print a figure: `fmt.rate(x)`, `fmt.ms(x)`, `fmt.pct(x)`, `fmt.mib(n)`;
"-" where nothing was measured (None or NaN)."""

from __future__ import annotations

import math


def rate(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.0f}"


def ms(x: float) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 100:.0f}%"


def mib(n: float) -> str:
    return "-" if n is None or math.isnan(n) else f"{n / 2**20:.1f}"
