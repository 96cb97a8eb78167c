"""Generation and update throughput: tracerl's trainer vs TRL's GRPOTrainer, in one run.

Issue 7 item 5. Both frameworks train the same tiny model (the embedded base model, a copy each)
with GRPO on the same single-turn version of the SynthWiki task: the prompt is the question
followed by the gold supporting documents, rendered as the react episode in which the agent
opened each of them (``Action: open[T]`` / ``Observation: T: ...``), so the policy only has to
write ``Action: answer[...]``. Same batch (``--prompts`` x ``--generations`` completions per
step, one optimiser step per batch, no accumulation), same sampling (temperature 1, no top-p or
top-k), same clipped loss (0.2 / 0.28, token mean over the batch: TRL ``loss_type="dapo"``),
no KL term, AdamW with the same learning rate and betas, float32, the same torch thread count.

tracerl side: ``Trainer.step()`` of the ``grpo`` preset on the tasks written as JSONL
(``data.source=files``), ``rollout.engine.max_turns=1``. TRL side: ``GRPOTrainer.train()`` with
its default transformers generation (``model.generate``; vLLM is not available on a CPU
machine). Timing per step: ``generation`` (tracerl ``time_rollout``; TRL ``_generate``),
``prepare`` (rewards, advantages, padding: tracerl ``time_scoring + time_advantages``; TRL the rest
of ``_generate_and_score_completions``) and ``update`` (loss, backward, clipping, AdamW: tracerl
``time_update``; TRL the rest of the optimiser step, timed from ``on_step_begin`` to
``on_step_end``), via a subclass and a callback that only add timers. Blocks run tracerl, TRL,
tracerl (A-B-A) so machine drift cancels; the first ``--warmup`` steps of every block are dropped.

Throughputs: ``generation_tokens_per_s`` (policy-sampled tokens per second of sampling) and
``update_tokens_per_s`` (the batch's prompt + completion tokens per second of update: what a batch
costs) and ``update_forwarded_tokens_per_s`` (only the tokens of rows the update forwards: tracerl
skips rows whose advantage is zero everywhere, which gives the same gradient without a KL term,
while TRL forwards every row; this one compares the raw forward/backward speed). TRL does not stop on
the react turn's end (tracerl ends a turn at its action's closing bracket, or ``Observation:``), so
a completion that calls a tool instead of answering runs on to EOS or the length cap in TRL; compare
tokens per second, not per step.

TRL is installed only in a separate environment (never in the project's dependencies):

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install torch==2.13.0          # first: the pinned CPU build
    .venv-bench/bin/pip install transformers==5.24.0 trl -e .
    .venv-bench/bin/python benchmarks/systems/vs_trl.py --quick   # ~30 s on 2 cores
    .venv-bench/bin/python benchmarks/systems/vs_trl.py           # ~3 min

Without TRL the script still measures tracerl and records why TRL did not run.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, configure_torch, fresh_dir, machine, mean, median, provenance_of, save_figure, write_json

INSTALL = ("python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 && "
           ".venv-bench/bin/pip install transformers==5.24.0 trl -e .")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 measured steps per block, 8x4 completions.")
    p.add_argument("--steps", type=int, default=6, help="Measured steps per block.")
    p.add_argument("--warmup", type=int, default=1, help="Steps dropped at the start of every block.")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24, help="Completion length cap (both frameworks).")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--tasks", type=int, default=400, help="Single-turn tasks built from the world.")
    p.add_argument("--model", default="", help="Model folder (default: the embedded tiny model of --tiny-preset).")
    p.add_argument("--tiny-preset", default="default", help="Embedded tiny model preset (e.g. smoke).")
    p.add_argument("--fact-seed", type=int, default=10_000, help="World the tasks come from (not pretrained on).")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/tracerl-bench"))
    p.add_argument("--out", type=Path, default=RESULTS / "vs_trl.json")
    args = p.parse_args()
    if args.quick:
        args.steps, args.generations = 2, 4
    return args


# --- the single-turn task --------------------------------------------------------------------------


def model_folder(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    return load_or_pretrain(get_preset(args.tiny_preset))


def world_config(folder: Path) -> Any:
    """The world whose names the model knows (stored by the tiny model; default otherwise)."""
    import json

    from tracerl.envs.synthwiki import WorldConfig

    stored = folder / "tiny_config.json"
    return WorldConfig(**json.loads(stored.read_text())["world"]) if stored.exists() else WorldConfig()


def single_turn_tasks(args: argparse.Namespace, folder: Path) -> tuple[list[Any], list[Any], list[str]]:
    """Tasks whose question text carries the gold documents; returns (tasks, documents, prompts)."""
    from tracerl.agent.formats import get_format
    from tracerl.core.types import Action, Task
    from tracerl.envs.base import Observation
    from tracerl.envs.search import SearchIndex, search_tools
    from tracerl.envs.synthwiki import build_world
    from tracerl.rollout.engine import EngineConfig

    cfg = world_config(folder)
    world = build_world(replace(cfg, fact_seed=args.fact_seed, num_train=min(args.tasks, cfg.num_train), num_test=0))
    tools = search_tools(SearchIndex(world.documents, use_cache=False),
                         max_tokens=EngineConfig().max_observation_tokens)
    fmt = get_format("react")
    tasks, prompts = [], []
    for task in world.train:
        steps = [(Action(kind="tool", name="open", arguments={"title": t}),
                  Observation(tools.call("open", {"title": t}), done=False, error=False))
                 for t in task.supporting_titles]
        text = fmt.render_episode(task, tools, steps)
        # render_prompt writes "Question: {question}\n": this question reproduces the episode exactly.
        question = text[len("Question: "):-1]
        single = Task(id=task.id, question=question, answers=task.answers, hops=task.hops)
        assert fmt.render_prompt(single, tools) == text
        tasks.append(single)
        prompts.append(text)
    return tasks, world.documents, prompts


# --- tracerl -------------------------------------------------------------------------------------------


def tracerl_trainer(args: argparse.Namespace, folder: Path, tasks: list[Any], documents: list[Any], tag: str) -> Any:
    from tracerl.envs.data import write_corpus, write_tasks
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer
    from tracerl.train.update import carries_signal

    data_dir = args.work_dir / "vs_trl_data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_tasks(tasks, data_dir / "tasks.jsonl")
    write_corpus(documents, data_dir / "corpus.jsonl")
    batch = args.prompts * args.generations
    config = resolve_config("grpo", overrides=[
        "data.source=files", f"data.tasks={data_dir / 'tasks.jsonl'}", f"data.corpus={data_dir / 'corpus.jsonl'}",
        f"model.name_or_path={folder}", "rollout.engine.max_turns=1", f"rollout.engine.max_turn_tokens={args.max_new_tokens}",
        f"rollout.budget={batch}", f"rollout.pool_size={args.prompts}", f"rollout.schemes.group_size={args.generations}",
        f"optim.micro_batch_size={batch}", f"optim.lr={args.lr}", "optim.kl_coef=0", "eval.every=0",
        "log.checkpoint_every=1000000", f"seed={args.seed}", "steps=1000000",
    ])
    trainer = Trainer(config, fresh_dir(args.work_dir / f"vs_trl_tracerl_{tag}"))
    sizes: list[tuple[int, int]] = []
    update = trainer._update

    def counted(pairs: list) -> dict[str, float]:
        """Batch tokens, and the tokens of rows the update forwards (all-zero-advantage rows are skipped)."""
        batch = sum(len(t.token_ids) for t, _ in pairs)
        forwarded = sum(len(t.token_ids) for t, adv in pairs if carries_signal(adv))
        sizes.append((batch, forwarded))
        return update(pairs)

    trainer._update = counted
    trainer.sequence_tokens = sizes
    return trainer


def run_tracerl(trainer: Any, steps: int, warmup: int) -> list[dict[str, float]]:
    rows = []
    for i in range(warmup + steps):
        record = trainer.step()
        if i >= warmup:
            rows.append({"generation_seconds": record["time_rollout"], "update_seconds": record["time_update"],
                         "prepare_seconds": record["time_scoring"] + record["time_advantages"],
                         "step_seconds": record["step_seconds"], "generated_tokens": record["generated_tokens"],
                         "sequence_tokens": trainer.sequence_tokens[-1][0],
                         "forwarded_tokens": trainer.sequence_tokens[-1][1], "completions": record["trajectories"],
                         "reward_mean": record["reward_mean"]})
    return rows


# --- TRL -------------------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, folder: Path, tasks: list[Any], prompts: list[str]) -> list[dict[str, float]]:
    """GRPOTrainer on the same prompts; raises ImportError without TRL."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tracerl.agent.formats import get_format
    from tracerl.envs.verifiers import exact_match

    fmt, by_id = get_format("react"), {t.id: t for t in tasks}

    def exact_match_reward(prompts: list, completions: list, task_id: list, **_: Any) -> list[float]:
        actions = [fmt.parse(text, {}) for text in completions]  # no tools: only answers can score
        return [exact_match(a.answer, by_id[i]) if a.kind == "answer" else 0.0 for a, i in zip(actions, task_id, strict=True)]

    rows: list[dict[str, float]] = []

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer plus timers around sampling and batch preparation (no behaviour change)."""

        def _generate(self, prompts: list) -> Any:
            start = time.perf_counter()
            out = super()._generate(prompts)
            prompt_ids, completion_ids = out[0], out[1]
            self._bench = {"generation_seconds": time.perf_counter() - start,
                           "generated_tokens": sum(len(c) for c in completion_ids),
                           "sequence_tokens": sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)),
                           "forwarded_tokens": sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)),
                           "completions": len(completion_ids)}
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self._bench["prepare_seconds"] = time.perf_counter() - start - self._bench["generation_seconds"]
            return out

    class StepClock(TrainerCallback):
        """Wall time of a whole optimiser step (sampling, loss, backward, clipping, AdamW)."""

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step, bench = time.perf_counter() - self.start, trainer._bench
            rows.append({**bench, "step_seconds": step,
                         "update_seconds": step - bench["generation_seconds"] - bench["prepare_seconds"],
                         "reward_mean": trainer._metrics["train"]["reward"][-1]})

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    config = trl_config(args, GRPOConfig)
    dataset = Dataset.from_list([{"prompt": text, "task_id": t.id} for text, t in zip(prompts, tasks, strict=True)])
    trainer = TimedGRPOTrainer(model=model, reward_funcs=exact_match_reward, args=config, train_dataset=dataset,
                               processing_class=tokenizer, callbacks=[StepClock()])
    trainer.train()
    return rows[args.warmup:]


def trl_config(args: argparse.Namespace, config_class: Any) -> Any:
    """GRPOConfig matching tracerl's grpo preset: one optimiser step per batch, no KL, same clip and AdamW."""
    batch = args.prompts * args.generations
    return config_class(
        output_dir=str(fresh_dir(args.work_dir / "vs_trl_trl")), per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=args.generations, max_completion_length=args.max_new_tokens,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.99, max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        num_iterations=1, temperature=1.0, top_p=1.0, top_k=0, max_steps=args.warmup + args.steps,
        logging_steps=args.warmup + args.steps + 1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=False, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
    )


# --- summary ---------------------------------------------------------------------------------------------


def summarise(rows: list[dict[str, float]]) -> dict[str, float | None]:
    gen_s = sum(r["generation_seconds"] for r in rows)
    upd_s = sum(r["update_seconds"] for r in rows)
    return {
        "generation_tokens_per_s": sum(r["generated_tokens"] for r in rows) / gen_s if gen_s else None,
        "update_tokens_per_s": sum(r["sequence_tokens"] for r in rows) / upd_s if upd_s else None,
        "update_forwarded_tokens_per_s": sum(r["forwarded_tokens"] for r in rows) / upd_s if upd_s else None,
        "update_forwarded_fraction": sum(r["forwarded_tokens"] for r in rows) / max(sum(r["sequence_tokens"] for r in rows), 1),
        "completions_per_s": sum(r["completions"] for r in rows) / sum(r["step_seconds"] for r in rows),
        "step_seconds": median([r["step_seconds"] for r in rows]),
        "generation_seconds": median([r["generation_seconds"] for r in rows]),
        "update_seconds": median([r["update_seconds"] for r in rows]),
        "prepare_seconds": median([r["prepare_seconds"] for r in rows]),
        "completion_tokens_mean": sum(r["generated_tokens"] for r in rows) / sum(r["completions"] for r in rows),
        "reward_mean": mean([r["reward_mean"] for r in rows]),
        "steps": len(rows),
    }


def plot(frameworks: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, m in frameworks.items() if "error" not in m]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "generation_tokens_per_s", "Generation (sampled tokens / s)"),
                           (axes[1], "update_tokens_per_s", "Update (prompt + completion tokens / s)")):
        ax.bar(names, [frameworks[n][key] or 0.0 for n in names], color=["tab:blue", "tab:orange"][: len(names)])
        ax.set(title=title)
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out)


def main() -> None:
    args = _args()
    configure_torch(args.threads)
    clock = time.perf_counter()
    folder = model_folder(args)
    tasks, documents, prompts = single_turn_tasks(args, folder)
    frameworks: dict[str, Any] = {}
    tracerl_rows = run_tracerl(tracerl_trainer(args, folder, tasks, documents, "a"), args.steps, args.warmup)
    try:
        frameworks["trl"] = summarise(run_trl(args, folder, tasks, prompts))
        import trl

        frameworks["trl"]["version"] = trl.__version__
    except ImportError as err:
        frameworks["trl"] = {"error": f"TRL is not installed in this environment ({err}); create it with: {INSTALL}"}
    except Exception as err:  # noqa: BLE001 - record why TRL could not run, keep tracerl's numbers
        frameworks["trl"] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=6)}
    tracerl_rows += run_tracerl(tracerl_trainer(args, folder, tasks, documents, "b"), args.steps, args.warmup)
    frameworks = {"tracerl": summarise(tracerl_rows), **frameworks}
    trl_ok = "error" not in frameworks["trl"]
    result = {
        "frameworks": frameworks,
        "tracerl_over_trl": {k: frameworks["tracerl"][k] / frameworks["trl"][k]
                             for k in ("generation_tokens_per_s", "update_tokens_per_s", "update_forwarded_tokens_per_s",
                                       "completions_per_s")
                             if trl_ok and frameworks["trl"][k]} or None,
        "setting": {"model": str(folder), "prompts_per_step": args.prompts, "generations_per_prompt": args.generations,
                    "max_new_tokens": args.max_new_tokens, "lr": args.lr, "tasks": len(tasks),
                    "prompt_tokens_mean": None, "world_fact_seed": args.fact_seed,
                    "measured_steps_per_block": args.steps, "warmup_steps_per_block": args.warmup,
                    "blocks": "tracerl, trl, tracerl"},
        "quick": args.quick,
        "seconds": time.perf_counter() - clock,
        **machine(),
        "provenance": provenance_of(name_or_path=args.model or "tiny", tiny_preset=args.tiny_preset),
    }
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    result["setting"]["prompt_tokens_mean"] = mean([len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts])
    write_json(args.out, result)
    png = plot(frameworks, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {png}")
    for name, m in frameworks.items():
        print(f"{name:>8}: " + (m["error"] if "error" in m else
              f"gen {m['generation_tokens_per_s']:.0f} tok/s  update {m['update_tokens_per_s']:.0f} tok/s  "
              f"step {m['step_seconds']:.2f}s  {m['completion_tokens_mean']:.1f} tokens/completion  reward {m['reward_mean']:.3f}"))


if __name__ == "__main__":
    main()
