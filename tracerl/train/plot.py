"""Learning curves of one or more runs, compared at equal sampling cost."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on machines without a display
import matplotlib.pyplot as plt  # noqa: E402

from tracerl.train.metrics import read_metrics  # noqa: E402


def _cumulative(values: list[float]) -> list[float]:
    return list(itertools.accumulate(values))


def plot_runs(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Held-out accuracy vs generated tokens and vs rollouts, and effective ratio per step."""
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run folder")
    labels = labels or [Path(d).name for d in run_dirs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for run_dir, label in zip(run_dirs, labels):
        records = read_metrics(Path(run_dir))
        tokens = _cumulative([r.get("generated_tokens", 0) or 0 for r in records])
        rollouts = _cumulative([r.get("rollouts", 0) or 0 for r in records])
        evals = [(t, n, r["eval_accuracy"]) for t, n, r in zip(tokens, rollouts, records) if r.get("eval_accuracy") is not None]
        if evals:
            axes[0].plot([e[0] for e in evals], [e[2] for e in evals], marker="o", label=label)
            axes[1].plot([e[1] for e in evals], [e[2] for e in evals], marker="o", label=label)
        axes[2].plot([r["step"] for r in records], [r.get("effective_ratio") for r in records], label=label)
    axes[0].set(xlabel="generated tokens (cumulative)", ylabel="held-out accuracy", title="Accuracy vs tokens")
    axes[1].set(xlabel="continuation rollouts (cumulative)", ylabel="held-out accuracy", title="Accuracy vs rollouts")
    axes[2].set(xlabel="step", ylabel="effective ratio", title="Share of mixed groups", ylim=(0, 1))
    for ax in axes[:2]:  # from zero: a two-point wobble on a plateau should not look like a collapse
        ax.set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
