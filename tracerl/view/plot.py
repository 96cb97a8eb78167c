"""Learning curves of one or more runs, compared at equal sampling cost.

Six panels: held-out accuracy vs generated tokens and vs rollouts (cumulative), the share of
mixed groups, the mean training reward, the policy loss, and turns per trajectory. Token and
rollout axes use compact engineering labels (``100k``, ``1.2M``) on at most a few ticks, so
labels never overlap. Accuracy curves start at step 0 when the run evaluated its initial
policy (``eval.at_start: true``); otherwise they start at the first evaluation. ``smooth``
draws an exponential moving average over the raw (faded) points.

The training-reward panel says under its title that it is no comparison between methods: its
value depends on which prompts were trained on, and TRACE allocation spends its budget on
prompts it predicts to be solvable (easier ones), so its training reward runs higher at equal
skill. Held-out accuracy (the first two panels) is the comparison.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: works on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from tracerl.atomic import write_atomic  # noqa: E402
from tracerl.runs.metrics import read_metrics  # noqa: E402

_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def compact(value: float) -> str:
    """``1234567 -> '1.2M'``, ``100000 -> '100k'``, ``950 -> '950'``: short, unambiguous tick labels."""
    for scale, suffix in _SUFFIXES:
        if abs(value) >= scale:
            text = f"{value / scale:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return f"{value:g}"


def ema(values: Sequence[float], smooth: float) -> list[float]:
    """Exponential moving average ``s_t = smooth * s_{t-1} + (1 - smooth) * x_t``, debiased like
    TensorBoard's (so the first points are not pulled toward 0). ``smooth = 0`` returns the values."""
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    out, running = [], 0.0
    for i, x in enumerate(values, start=1):
        running = smooth * running + (1.0 - smooth) * x
        out.append(running / (1.0 - smooth**i) if smooth else x)
    return out


def _cumulative(values: list[float]) -> list[float]:
    return list(itertools.accumulate(values))


def _series(records: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    points = [(r[x_key], r[y_key]) for r in records if r.get(y_key) is not None and r.get(x_key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _draw(ax: Any, xs: list[float], ys: list[float], label: str, smooth: float, marker: str = "") -> None:
    if not xs:
        return
    if smooth and len(xs) > 1:
        (raw,) = ax.plot(xs, ys, alpha=0.25, marker=marker)
        ax.plot(xs, ema(ys, smooth), color=raw.get_color(), label=label)
    else:
        ax.plot(xs, ys, marker=marker, label=label)


def _with_costs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with cumulative ``tokens`` and ``rollouts`` (a step-0 record adds nothing)."""
    tokens = _cumulative([r.get("generated_tokens", 0) or 0 for r in records])
    rollouts = _cumulative([r.get("rollouts", 0) or 0 for r in records])
    return [{**r, "tokens": t, "cum_rollouts": n}
            for r, t, n in zip(records, tokens, rollouts, strict=True)]


def final_point(records: list[dict[str, Any]], final: dict[str, Any]) -> dict[str, float] | None:
    """Where ``final`` goes on the accuracy panels: the cumulative tokens and rollouts of the
    record of its step (records from :func:`_with_costs`); None when no record has that step."""
    match = [r for r in records if r["step"] == final["step"]]
    if not match:
        return None
    return {"tokens": match[-1]["tokens"], "cum_rollouts": match[-1]["cum_rollouts"],
            "eval_accuracy": float(final["eval_accuracy"])}


def _draw_final(axes: list[Any], records: list[dict[str, Any]], final: dict[str, Any]) -> None:
    point = final_point(records, final)
    if point is None:
        return
    for ax, (x_key, y_key, *_rest) in zip(axes, PANELS, strict=False):
        if y_key == "eval_accuracy":
            ax.plot([point[x_key]], [point[y_key]], marker="*", markersize=14, linestyle="none", color="black",
                    label=str(final.get("label", "final evaluation")))


PANELS = (  # (x key, y key, x label, y label, title)
    ("tokens", "eval_accuracy", "generated tokens (cumulative)", "held-out accuracy", "Accuracy vs tokens"),
    ("cum_rollouts", "eval_accuracy", "continuation rollouts (cumulative)", "held-out accuracy", "Accuracy vs rollouts"),
    ("step", "effective_ratio", "step", "effective ratio", "Share of mixed groups"),
    ("step", "reward_mean", "step", "mean reward",
     "Training reward\n(depends on which prompts were chosen: TRACE picks\neasier ones; "
     "compare held-out accuracy)"),
    ("step", "loss", "step", "policy loss", "Loss"),
    ("step", "turns_mean", "step", "turns per trajectory", "Turns"),
)


def plot_runs(run_dirs: list[Path], out: Path, labels: list[str] | None = None, smooth: float = 0.0,
              finals: Sequence[dict[str, Any] | None] | None = None) -> Path:
    """Write the six panels (module docstring) for ``run_dirs`` to the PNG ``out``; returns it.

    ``finals``: per run, an evaluation made after training (``{"step", "eval_accuracy", "label"}``,
    e.g. the demo's on more questions than the periodic ones), drawn as a star on the accuracy
    panels at the cost that run had spent by that step; None for a run without one."""
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run folder")
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"--smooth must be in [0, 1) (0: raw curves; 0.6 is mild), got {smooth}")
    if finals is not None and len(finals) != len(run_dirs):
        raise ValueError(f"finals: {len(finals)} given for {len(run_dirs)} run folders; give one (or None) per run")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels: {len(labels)} given for {len(run_dirs)} run folders; give one per run")
    fig = figure(run_dirs, labels or [Path(d).name for d in run_dirs], smooth, finals or [None] * len(run_dirs))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()  # rendered whole, then written atomically: a full disk leaves the old file
    fig.savefig(image, dpi=110, format=out.suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    write_atomic(out, image.getvalue())
    return out


def figure(run_dirs: list[Path], labels: list[str], smooth: float, finals: Sequence[dict[str, Any] | None]) -> Any:
    """The matplotlib figure of :func:`plot_runs` (arguments checked there)."""
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    flat = list(axes.flat)
    for run_dir, label, final in zip(run_dirs, labels, finals, strict=True):
        records = _with_costs(read_metrics(Path(run_dir)))
        for ax, (x_key, y_key, *_rest) in zip(flat, PANELS, strict=True):
            marker = "o" if y_key == "eval_accuracy" else ""
            _draw(ax, *_series(records, x_key, y_key), label=label, smooth=smooth, marker=marker)
        if final is not None:
            _draw_final(flat, records, final)
    for ax, (x_key, y_key, x_label, y_label, title) in zip(flat, PANELS, strict=True):
        ax.set(xlabel=x_label, ylabel=y_label, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        if x_key in ("tokens", "cum_rollouts"):
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: compact(v)))
            ax.set_ylim(bottom=0)  # from zero: a two-point wobble on a plateau should not look like a collapse
        if y_key == "effective_ratio":
            ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
