"""``tracerl demo``: the embedded default, end to end: at most 100 steps (or 4 minutes) of RL plus
the evaluations on 2 CPU cores.

1. build the SynthWiki worlds (training worlds, an unseen world, a re-drawn-facts world);
2. take the tiny base model shipped in the package (nothing is pretrained; its sha256 is checked);
3. evaluate the base model on held-out questions of the unseen world;
4. train the ``trace`` preset (TRACE allocation + TRACE credit) for :data:`MAX_STEPS` steps or
   :data:`TRAIN_MINUTES` minutes, whichever ends first;
5. evaluate the trained model on the unseen world and, as a memorisation check, on training
   questions of a world whose facts were re-drawn;
6. write learning curves and the summary.

Each demo writes a new run folder into ``--out`` (``run``, then ``run-2``, ...: see
:mod:`tracerl.train.demo_folder`); a previous run is never touched.

Why the demo's settings differ from the ``trace`` preset's: at lr 1e-3 with the
paper's ungated turn term, a run collapsed past step ~40-120. In a group whose rollouts all
failed (or all succeeded) the outcome advantage is 0 and the turn term ``w_turn c_k`` was the
only gradient, and it was positive on 95-100% of those transitions (a search raises the
reference's readiness): every token of a search turn was pushed up, including junk the action
parser skips (``Action?\\nAction?\\n...Action: open[X]``). The junk grew, the generations went
from ~1.7k to 7-44k tokens a step and the reward to 0, and with no reward left the turn term
was all there was. ``credit_centre=gated`` centres the turn term inside mixed groups and drops
it in all-same ones, so no group pushes up everything it sampled. The divergence guard rolls
a run back to its last good checkpoint when generations blow up all the same, and the step cap
keeps a fast machine from training past the steps the demo was measured over.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from tracerl.atomic import write_atomic
from tracerl.train.demo_folder import DemoPaths, claim

if TYPE_CHECKING:
    from tracerl.config.schema import TrainConfig

# The model stack (torch, transformers, the trainer) is imported inside run_demo, after its first
# line: on a busy 2-core machine the imports alone took 20 s, and a newcomer saw nothing meanwhile.

MAX_STEPS = 100
"""The demo's step cap: its wall-clock budget alone let a fast idle machine train on past the
steps it was measured over (and into a collapse at step ~117)."""
DEMO_OVERRIDES: list[str] = [
    f"steps={MAX_STEPS}",  # bounded by steps as well as by the wall-clock budget
    "data.world.max_hops=2",  # one- and two-hop questions: learnable in minutes on 2 CPU cores
    "data.search_top_k=2",
    "rollout.budget=128",
    "rollout.pool_size=32",
    "rollout.schemes.group_size=8",
    "optim.lr=1e-3",
    "algo.advantage.credit_centre=gated",  # the cause of the collapse (module docstring)
    "optim.divergence.mode=rollback",  # a blow-up all the same ends the run on its last good checkpoint
    "eval.every=25",
    "eval.size=100",
    "log.checkpoint_every=10",  # a rollback needs a checkpoint from before the blow-up: the 4 newest
    "log.keep_last=4",          # reach 30-40 steps back (12 MB each)
]
TRAIN_MINUTES = 4.0
"""RL wall-clock budget, the bound on a slow or busy machine (:data:`MAX_STEPS` on a fast one)."""
FINAL_EVAL_SIZE = 300


def demo_config() -> TrainConfig:
    from tracerl.config.schema import resolve_config

    return resolve_config("trace", overrides=DEMO_OVERRIDES)


def choose_threads(config: TrainConfig) -> str:
    """The torch threads and how busy the machine was at start, for the console and the summary.

    The threads stay ``$TRACERL_THREADS``, ``model.threads`` or every available core, and OpenMP
    threads sleep while they wait (:func:`run_demo` sets ``OMP_WAIT_POLICY=PASSIVE`` before torch
    is imported). Measured beside a spinning process on 2 shared cores (benchmarks/systems/busy_threads.py,
    median s a step over 4 steps): two spinning threads 81 (and one run that had not done 3 steps in
    600 s), two passive threads 26, one thread 41, one passive thread (the cores found free) 51. A
    passive thread costs nothing while it waits, and two of them get more of a shared machine."""
    from tracerl.busy_cores import free_cores
    from tracerl.models.threads import available_cores, resolve_threads

    policy = f"OpenMP wait policy {os.environ.get('OMP_WAIT_POLICY', 'default').lower()}"
    free, cores = free_cores(), available_cores()
    load = f", {free} of {cores} cores free at start" if free is not None else ""
    return f"torch threads: {resolve_threads(config.model.threads)}{load}; {policy}"


def run_demo(out: str | Path, train_minutes: float | None = None, console: Console | None = None,
             max_steps: int | None = None) -> dict[str, Any]:
    """Run the demo into a new run folder of ``out`` and return the summary it writes there."""
    console = console or Console()
    start = time.perf_counter()
    budget_s = 60 * (TRAIN_MINUTES if train_minutes is None else train_minutes)
    paths = claim(Path(out))  # refuses a foreign non-empty --out before anything is loaded
    from tracerl.busy_cores import passive_wait

    passive_wait()  # before anything imports torch (the config's modules do)
    config = demo_config()
    if max_steps is not None:
        config.steps = max_steps
    console.print(f"tracerl demo -> {paths.run}: SynthWiki, the shipped tiny base model, `trace` for {config.steps} "
                  f"steps or {budget_s / 60:.1f} minutes, evaluation; loading torch ...")
    threads = choose_threads(config)
    from tracerl.envs.synthwiki import build_world, write_world
    from tracerl.testbed.shipped import read_manifest
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset
    from tracerl.train.loop import Trainer

    unseen = build_world(replace(config.data.world, fact_seed=config.data.eval_fact_seed))
    if not (paths.out / "unseen_world").exists():  # byte-identical per config: an earlier demo's copy stands
        write_world(unseen, paths.out / "unseen_world")
    console.print(f"[bold]1/5[/] SynthWiki: {len(unseen.documents)} documents per world, "
                  f"{config.data.train_worlds} training worlds, unseen world in {paths.out / 'unseen_world'}")

    model_dir = load_or_pretrain(get_preset(config.model.tiny_preset))
    manifest = read_manifest(model_dir)
    where = f"shipped, sha256 {manifest['sha256'][:12]}" if manifest else "pretrained here, cached"
    console.print(f"[bold]2/5[/] tiny base model ({where}): {model_dir}; {threads}")

    from tracerl.runs.warn_console import warnings_to_console

    say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731 - a line as it is
    with warnings_to_console(say, console.width) as shown, Trainer(config, paths.run) as trainer:
        trainer.echo_line = say
        summary = _train_and_evaluate(trainer, console, budget_s, paths)
    summary.update(warnings=shown, minutes=(time.perf_counter() - start) / 60, model=str(model_dir), threads=threads,
                   model_sha256=manifest["sha256"] if manifest else None, run_dir=str(paths.run))
    write_atomic(paths.summary, (json.dumps(summary, indent=2) + "\n").encode())
    _print_summary(console, summary)
    console.print(f"summary {paths.summary}, curves {paths.curves}")
    console.print(next_steps(paths.run))
    return summary


def _train_and_evaluate(trainer: Any, console: Console, budget_s: float, paths: DemoPaths) -> dict[str, Any]:
    """Steps 3-4: the base model's held-out accuracy, RL to the step cap or the time budget, the
    trained model's accuracy (unseen world and re-drawn facts) and the curves; the summary's numbers."""
    from tracerl.view.plot import plot_runs

    final_eval = min(FINAL_EVAL_SIZE, len(trainer.data.held_out))
    base = _evaluate(trainer, trainer.data.held_out, "eval", final_eval)
    # the curves' first point (what eval.at_start writes), on the final evaluation's questions
    trainer.log.write({"step": 0, "total_rollouts": 0, "total_generated_tokens": 0, "rollouts": 0,
                       "generated_tokens": 0, **base})
    console.print(f"[bold]3/5[/] base model: {base['eval_accuracy']:.1%} on {final_eval} unseen-world questions")

    target = trainer.config.steps
    console.print(f"[bold]4/5[/] training `trace`: {target} steps or {budget_s / 60:.1f} minutes, whichever ends first")
    deadline = time.perf_counter() + budget_s
    trainer.echo = step_printer(console, target, deadline, console.width)
    trainer.run(deadline=deadline)
    trainer.save()
    stopped = ("rollback" if trainer.rolled_back else "steps" if trainer.step_index >= target else "time")

    trained = _evaluate(trainer, trainer.data.held_out, "trained", final_eval)
    redrawn = _evaluate(trainer, trainer.data.redrawn, "redrawn", min(FINAL_EVAL_SIZE, len(trainer.data.redrawn)))
    final = {"step": trainer.step_index, "eval_accuracy": trained["trained_accuracy"],
             "label": f"final evaluation ({final_eval} questions)"}
    plot = plot_runs([trainer.run_dir], paths.curves, labels=["trace"], finals=[final])
    return {
        "base_accuracy": base["eval_accuracy"],
        "trained_accuracy": trained["trained_accuracy"],
        "redrawn_facts_accuracy": redrawn["redrawn_accuracy"],
        "eval_questions": final_eval,
        "train_steps": trainer.step_index,
        "max_steps": target,
        "stopped_by": stopped,
        "evaluated_model": _evaluated_model(trainer),
        "rolled_back": trainer.rolled_back,
        "train_rollouts": trainer.totals["rollouts"],
        "train_generated_tokens": trainer.totals["generated_tokens"],
        "plot": str(plot),
    }


def _evaluate(trainer: Any, tasks: list[Any], label: str, size: int) -> dict[str, float]:
    """``trainer.evaluate`` on the first ``size`` of ``tasks`` (the periodic evaluations use fewer)."""
    periodic, trainer.config.eval.size = trainer.config.eval.size, size
    try:
        return dict(trainer.evaluate(tasks, label))
    finally:
        trainer.config.eval.size = periodic


def _evaluated_model(trainer: Any) -> str:
    """Which weights the final evaluation measured: said in the summary, never implied."""
    if trainer.rolled_back:
        back = trainer.rolled_back
        return (f"the checkpoint of step {back['to_step']}, rolled back to when training diverged at step "
                f"{back['fired_at']} (it began at step {back['onset']})")
    return f"the last step's weights (step {trainer.step_index})"


def step_printer(console: Console, total: int, deadline: float, width: int) -> Any:
    """The trainer's 80-column progress line (runs/console.py) for each step, its ETA the sooner
    of the step cap and the wall-clock ``deadline``."""
    from tracerl.runs.console import progress_line

    started, done = time.perf_counter(), [0]

    def echo(record: dict[str, Any]) -> None:
        done[0] += 1
        now = time.perf_counter()
        line = progress_line(record, total, now - started, done[0], width, time_left=deadline - now)
        console.print(line, markup=False, highlight=False)

    return echo


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
    table.add_row("stopped by", {"steps": f"the step cap ({summary['max_steps']})", "time": "the time budget",
                                 "rollback": "the divergence guard"}[summary["stopped_by"]])
    table.add_row("generated tokens", f"{summary['train_generated_tokens']:,}")
    table.add_row("minutes (total)", f"{summary['minutes']:.1f}")
    console.print(table)
    console.print(f"evaluated: {summary['evaluated_model']}")
