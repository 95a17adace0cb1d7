"""PNG plots for the benchmark reports (matplotlib, headless ``Agg`` backend).

Each function draws one figure from plain numbers and writes it to ``path``; matplotlib is
imported inside them, so a scenario's parser never needs it. Medians are drawn as lines and the
min..max over trials as error bars or bands.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    low: Sequence[float | None] | None = None  # min over trials
    high: Sequence[float | None] | None = None  # max over trials
    style: str = "o-"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, label: str, x: Sequence[float], summaries: Sequence[Mapping[str, Any]],
           style: str = "o-") -> Series:
        """Medians of ``summaries`` (``harness.summary``) with their min..max."""
        return cls(label, x, *([s[k] for s in summaries] for k in ("median", "min", "max")),
                   style=style)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _yerr(ys: Sequence[float], low: Sequence[float | None], high: Sequence[float | None]
          ) -> list[list[float]]:
    """matplotlib's ``yerr`` for min..max around ``ys`` (a missing bound: no bar that side)."""
    return [[max(0.0, y - _or(lo, y)) for y, lo in zip(ys, low, strict=True)],
            [max(0.0, _or(hi, y) - y) for y, hi in zip(ys, high, strict=True)]]


def _finish(ax: Any, title: str, ylabel: str, logy: bool, **grid: str) -> None:
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3, **grid)
    ax.legend(fontsize=8)


def _draw(ax: Any, s: Series) -> None:
    points = [(x, y, i) for i, (x, y) in enumerate(zip(s.x, s.y, strict=True)) if y is not None]
    if not points:
        return
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if s.low is not None and s.high is not None:
        ax.errorbar(xs, ys, yerr=_yerr(ys, [s.low[i] for _, _, i in points],
                                       [s.high[i] for _, _, i in points]),
                    fmt=s.style, capsize=3, label=s.label, **s.extra)
    else:
        ax.plot(xs, ys, s.style, label=s.label, **s.extra)


def _reference_lines(ax: Any, hlines: Sequence[tuple[str, float]]) -> None:
    styles = ("--", ":", "-.")
    for i, (label, y) in enumerate(hlines):
        ax.axhline(y, linestyle=styles[i % len(styles)], color=f"C{(i + 5) % 10}", linewidth=1,
                   label=label)


def _save(plt: Any, fig: Any, path: Path, note: str | None) -> Path:
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="dimgrey")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def line_chart(path: Path, *, title: str, xlabel: str, ylabel: str, series: Sequence[Series],
               hlines: Sequence[tuple[str, float]] = (), diagonal: bool = False,
               logy: bool = False, logx: bool = False, xticks: Sequence[float] | None = None,
               note: str | None = None) -> Path:
    """Lines with min..max error bars; ``hlines`` are labelled reference levels; ``diagonal``
    draws y = x (achieved = offered)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for s in series:
        _draw(ax, s)
    _reference_lines(ax, hlines)
    if diagonal:
        xs = [x for s in series for x in s.x]
        if xs:
            top = max(xs)
            ax.plot([0, top], [0, top], color="grey", linewidth=0.8, linestyle="--",
                    label="achieved = offered")
    if logx:
        ax.set_xscale("log", base=2)
    if xticks is not None:
        ax.set_xticks(list(xticks))
        ax.set_xticklabels([f"{x:g}" for x in xticks])
    ax.set_xlabel(xlabel)
    _finish(ax, title, ylabel, logy, which="both")
    return _save(plt, fig, path, note)


def grouped_bars(path: Path, *, title: str, ylabel: str, groups: Sequence[str],
                 bars: Mapping[str, Sequence[float | None]],
                 low: Mapping[str, Sequence[float | None]] | None = None,
                 high: Mapping[str, Sequence[float | None]] | None = None,
                 hlines: Sequence[tuple[str, float]] = (), logy: bool = False,
                 note: str | None = None) -> Path:
    """One cluster of bars per group (e.g. a priority), one bar per key of ``bars`` (e.g. p50,
    p90, p99), with min..max error bars and labelled reference levels."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    width = 0.8 / max(len(bars), 1)
    for i, (name, values) in enumerate(bars.items()):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None else 0.0 for v in values]
        yerr = (_yerr(ys, low[name], high[name]) if low is not None and high is not None
                and name in low and name in high else None)
        ax.bar(xs, ys, width=width, label=name, yerr=yerr, capsize=3)
        for x, v in zip(xs, values, strict=True):
            if v is not None:
                ax.annotate(f"{v:.0f}", (x, v), ha="center", va="bottom", fontsize=7)
    _reference_lines(ax, hlines)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    _finish(ax, title, ylabel, logy, axis="y")
    return _save(plt, fig, path, note)


def trial_bars(path: Path, *, values: Mapping[str, Sequence[Sequence[float]]], **kwargs: Any
               ) -> Path:
    """``grouped_bars`` of per-trial values (``values[bar][group]``: one value per trial): the
    median as the bar, min..max as its error bar."""
    def pick(how: Any) -> dict[str, list[float | None]]:
        return {name: [how(v) if v else None for v in groups] for name, groups in values.items()}
    return grouped_bars(path, bars=pick(statistics.median), low=pick(min), high=pick(max),
                        **kwargs)


def batch_histograms(path: Path, *, title: str, panels: Mapping[str, Mapping[Any, int]],
                     weight_by_requests: bool = True, note: str | None = None) -> Path:
    """One small histogram per panel (e.g. per offered load): the share of requests (or of
    batches) that ran in a batch of each size (the sizes may be strings, as JSON keeps
    them)."""
    plt = _pyplot()
    n = max(len(panels), 1)
    fig, axes = plt.subplots(1, n, figsize=(min(3.0 * n + 1.0, 16.0), 3.6), dpi=110,
                             sharey=True, squeeze=False)
    for ax, (label, by_size) in zip(axes[0], panels.items(), strict=False):
        counts = {int(k): int(v) for k, v in by_size.items()}
        sizes = sorted(counts)
        weights = [counts[k] * (k if weight_by_requests else 1) for k in sizes]
        total = sum(weights) or 1
        ax.bar(sizes, [w / total for w in weights], width=0.8)
        batches = sum(counts.values())
        mean = sum(k * counts[k] for k in sizes) / max(batches, 1)
        ax.set_title(f"{label}\n{batches} batches, mean size {mean:.1f}", fontsize=9)
        ax.set_xlabel("batch size")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("share of requests" if weight_by_requests else "share of batches")
    fig.suptitle(title, fontsize=10)
    return _save(plt, fig, path, note)
