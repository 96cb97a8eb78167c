"""``tracerl demo``: the embedded default, end to end: 4 minutes of RL plus the evaluations on 2 CPU
cores (measured: 5.8 minutes in all beside one busy process, 8.8 on a crowded machine; README).

1. build the SynthWiki worlds (training worlds, an unseen world, a re-drawn-facts world);
2. take the tiny base model shipped in the package (nothing is pretrained; its sha256 is checked);
3. evaluate the base model on held-out questions of the unseen world;
4. train the ``trace`` preset (TRACE allocation + TRACE credit) for a fixed wall-clock budget;
5. evaluate the trained model on the unseen world and, as a memorisation check, on training
   questions of a world whose facts were re-drawn;
6. write learning curves and ``summary.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from tracerl.config.schema import TrainConfig

# The model stack (torch, transformers, the trainer) is imported inside run_demo, after its first
# line: on a busy 2-core machine the imports alone took 20 s, and a newcomer saw nothing meanwhile.

DEMO_OVERRIDES: list[str] = [
    "steps=100000",  # the demo stops on its wall-clock budget, not a step count
    "data.world.max_hops=2",  # one- and two-hop questions: learnable in minutes on 2 CPU cores
    "data.search_top_k=2",
    "rollout.budget=128",
    "rollout.pool_size=32",
    "rollout.schemes.group_size=8",
    "optim.lr=1e-3",
    "eval.every=25",
    "eval.size=100",
    "log.checkpoint_every=25",
]
TRAIN_MINUTES = 4.0
"""RL wall-clock budget, chosen so that with the three evaluations the whole demo aims at about
five minutes on 2 idle cores (not yet measured idle; see the README's demo table)."""
FINAL_EVAL_SIZE = 300


def demo_config() -> TrainConfig:
    from tracerl.config.schema import resolve_config

    return resolve_config("trace", overrides=DEMO_OVERRIDES)


def run_demo(out: str | Path, train_minutes: float | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run the demo into ``out`` and return the summary it writes to ``out/summary.json``."""
    console = console or Console()
    out, start = Path(out), time.perf_counter()
    budget_s = 60 * (TRAIN_MINUTES if train_minutes is None else train_minutes)
    console.print(f"tracerl demo -> {out}: SynthWiki, the shipped tiny base model, {budget_s / 60:.1f} minutes of "
                  "`trace`, evaluation; loading torch ...")
    from tracerl.config.schema import config_to_yaml
    from tracerl.envs.synthwiki import build_world, write_world
    from tracerl.testbed.shipped import read_manifest
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset
    from tracerl.train.loop import Trainer

    out.mkdir(parents=True, exist_ok=True)
    config = demo_config()
    unseen = build_world(replace(config.data.world, fact_seed=config.data.eval_fact_seed))
    write_world(unseen, out / "unseen_world")
    console.print(f"[bold]1/5[/] SynthWiki: {len(unseen.documents)} documents per world, "
                  f"{config.data.train_worlds} training worlds, unseen world in {out / 'unseen_world'}")

    model_dir = load_or_pretrain(get_preset(config.model.tiny_preset))
    manifest = read_manifest(model_dir)
    where = f"shipped, sha256 {manifest['sha256'][:12]}" if manifest else "pretrained here, cached"
    console.print(f"[bold]2/5[/] tiny base model ({where}): {model_dir}")

    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # the demo always starts over (a Trainer refuses a used folder)
    (run_dir).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    summary = _train_and_evaluate(Trainer(config, run_dir), console, budget_s)
    summary.update(minutes=(time.perf_counter() - start) / 60, model=str(model_dir),
                   model_sha256=manifest["sha256"] if manifest else None, run_dir=str(run_dir))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(console, summary)
    console.print(next_steps(run_dir))
    return summary


def _train_and_evaluate(trainer: Any, console: Console, budget_s: float) -> dict[str, Any]:
    """Steps 3-4: the base model's held-out accuracy, ``budget_s`` seconds of RL, the trained
    model's accuracy (unseen world and re-drawn facts) and the curves; the summary's numbers."""
    from tracerl.runs.metrics import console_line
    from tracerl.view.plot import plot_runs

    final_eval = min(FINAL_EVAL_SIZE, len(trainer.data.held_out))
    eval_size = trainer.config.eval.size
    trainer.config.eval.size = final_eval
    base = trainer.evaluate(trainer.data.held_out, "base")
    trainer.config.eval.size = eval_size
    console.print(f"[bold]3/5[/] base model: {base['base_accuracy']:.1%} on {final_eval} unseen-world questions")

    console.print(f"[bold]4/5[/] training `trace` for {budget_s / 60:.1f} minutes")
    trainer.echo = lambda record: console.print("      " + console_line(record))
    trainer.run(deadline=time.perf_counter() + budget_s)
    trainer.save()

    trainer.config.eval.size = final_eval
    trained = trainer.evaluate(trainer.data.held_out, "trained")
    trainer.config.eval.size = min(FINAL_EVAL_SIZE, len(trainer.data.redrawn))
    redrawn = trainer.evaluate(trainer.data.redrawn, "redrawn")
    plot = plot_runs([trainer.run_dir], trainer.run_dir.parent / "curves.png", labels=["trace"])
    return {
        "base_accuracy": base["base_accuracy"],
        "trained_accuracy": trained["trained_accuracy"],
        "redrawn_facts_accuracy": redrawn["redrawn_accuracy"],
        "eval_questions": final_eval,
        "train_steps": trainer.step_index,
        "train_rollouts": trainer.totals["rollouts"],
        "train_generated_tokens": trainer.totals["generated_tokens"],
        "plot": str(plot),
    }


def next_steps(run_dir: Path) -> str:
    """Where the ``tracerl`` command is (``make demo`` installs it into ``.venv``) and what to run next."""
    bin_dir = Path(sys.executable).parent
    command = bin_dir / "tracerl"
    path = f"`. {bin_dir / 'activate'}` puts it on PATH" if (bin_dir / "activate").is_file() else "it is on PATH"
    return (f"tracerl is {command} ({path}). Next: tracerl eval --run {run_dir}; tracerl view {run_dir}; "
            f"tracerl plot {run_dir}")


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title="[bold]5/5[/] tracerl demo summary")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("base accuracy (unseen world)", f"{summary['base_accuracy']:.1%}")
    table.add_row("trained accuracy (unseen world)", f"{summary['trained_accuracy']:.1%}")
    table.add_row("trained accuracy (re-drawn facts)", f"{summary['redrawn_facts_accuracy']:.1%}")
    table.add_row("training steps / rollouts", f"{summary['train_steps']} / {summary['train_rollouts']}")
    table.add_row("generated tokens", f"{summary['train_generated_tokens']:,}")
    table.add_row("minutes (total)", f"{summary['minutes']:.1f}")
    console.print(table)
