"""pytest configuration of the creditflow benchmarks (``benches/`` only).

Every benchmark reports its headline figure (GB/s, µs per batch, speed-up over the numpy
baseline) through the ``report`` fixture; the figures are printed as one table at the end of
the session, next to their targets, and land in ``benchmark.extra_info`` (so in
``--benchmark-json`` output too).

Targets are informational by default (timings on a shared, loaded machine are noisy). Set
``CREDITFLOW_BENCH_STRICT=1`` to turn a missed target into a test failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: float | None
    higher_is_better: bool

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


_FIGURES: dict[str, Figure] = {}


def strict() -> bool:
    return os.environ.get("CREDITFLOW_BENCH_STRICT", "").lower() not in ("", "0", "false")


class Reporter:
    """Records headline figures; see :func:`report`."""

    def __init__(self, benchmark: object) -> None:
        self._benchmark = benchmark

    def __call__(
        self,
        name: str,
        value: float,
        unit: str,
        target: float | None = None,
        *,
        higher_is_better: bool = True,
    ) -> Figure:
        fig = Figure(name, value, unit, target, higher_is_better)
        _FIGURES[name] = fig
        extra = getattr(self._benchmark, "extra_info", None)
        if extra is not None:
            extra[name] = round(value, 4)
            if target is not None:
                extra[f"{name} target"] = f"{'>=' if higher_is_better else '<='} {target}"
        if strict() and fig.met is False:
            op = ">=" if higher_is_better else "<="
            pytest.fail(f"{name}: {value:.3f} {unit} misses the target {op} {target} {unit}")
        return fig

    @staticmethod
    def get(name: str) -> Figure | None:
        """A figure an earlier benchmark of this session recorded."""
        return _FIGURES.get(name)


@pytest.fixture
def report(benchmark: object) -> Reporter:
    """``report(name, value, unit, target=None, higher_is_better=True)`` records a headline
    figure: in ``benchmark.extra_info``, in the end-of-session table, and (strict mode) as an
    assertion against its target. ``report.get(name)`` returns a figure recorded earlier."""
    return Reporter(benchmark)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FIGURES:
        return
    tr = terminalreporter
    tr.section("creditflow benchmark figures (medians)")
    width = max(len(f.name) for f in _FIGURES.values())
    for f in _FIGURES.values():
        if f.target is None:
            verdict = "(for information)"
        else:
            op = ">=" if f.higher_is_better else "<="
            verdict = f"target {op} {f.target:g} {f.unit}: {'met' if f.met else 'MISSED'}"
        tr.write_line(f"{f.name:<{width}}  {f.value:10.3f} {f.unit:<6} {verdict}")
