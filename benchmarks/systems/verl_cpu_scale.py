"""TRACE inside verl against verl's own tool agent loop running GRPO, on the CPU, in one run.

Both sides run ``python -m verl.trainer.main_ppo`` through ``examples/verl/cpu/run.sh`` (the smoke
tiny model, 2 actor ranks so 2 ``tracerl_hf`` rollout replicas, 2 agent-loop workers, verl's
client and router), on the same prompts (``--prompts`` a step) for ``--steps`` steps:

* ``trace``: :class:`~tracerl.integrations.verl.manager.TraceAgentLoopManager`, budget
  ``prompts x group`` leaves a step, trees expanded on the 2 tree workers with independent turns,
  readiness scored on verl's reference worker (run.sh's TRACE, credit on);
* ``trace_alloc``: the same manager and tree allocation without credit (no readiness, no reference
  worker): TRACE's rollout machinery alone against verl's loop;
* ``verl_grpo_tool_agent``: verl's ``AgentLoopManagerTQ`` with its ``tool_agent`` loop and GRPO,
  ``rollout.n = group`` (the same samples a step), a native search tool over the same corpus with
  tracerl's BM25 search, a react tool parser and tracerl's exact-match reward
  (``verl_cpu_scale_parts.py``), prompts rendered as TRACE renders them (``Question: ...``), a
  turn stopping at ``]`` as TRACE's do, at most ``--turns`` assistant turns (TRACE's
  ``max_turns``) in run.sh's 384-token response; so the samples are alike in shape, and the JSON
  gives the tokens per sample of each and verl's sample tokens over TRACE's. verl's loop caps a
  turn only by the response left, so TRACE's turns get the same cap (``--turn-tokens``, default
  384, in place of the smoke config's 16-token turns, which made TRACE's requests a third as long
  as verl's and its rate a rate of per-request overheads).

Each side's rollout is timed the same way (``verl_cpu_scale_parts._timed``): from the call of
``generate_sequences`` until every prompt of the batch is ``finished`` in TransferQueue (what
verl's trainer waits for): seconds, the tokens the servers sampled (TRACE: the manager's count, a
tree's shared turns once), the tokens of the samples (their ``response_mask``) and the
TaskRunner's peak RSS; for TRACE also the step's split (the manager's ``generation_seconds``:
tree expansion, ``readiness_seconds``: scoring, the rest: planning and the predictor). Reported:
rollout tokens per second of each arm (sampled tokens over seconds) over all steps and over the
steps after the first, each TRACE arm's ratios over verl (``ratios``: whole rollout, after step 1,
and ``generation_only``, TRACE's sampled tokens over its expansion seconds; the issue's goal is
>= 0.8), the tokens of each (equal samples a step), the peak RSS of each TaskRunner, and TRACE's
readiness tokens (``readiness_tokens_forwarded`` against ``readiness_tokens_full_prefix``).

    HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled .venv-verl/bin/python benchmarks/systems/verl_cpu_scale.py
    ... --steps 1 --prompts 4 --group 2 --dry-run   # a small check that every arm runs (writes nothing)

Writes ``benchmarks/results/verl_cpu_scale.json``. Run it alone: on 2 cores every other process
moves the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "examples" / "verl" / "cpu"
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
sys.path.insert(2, str(ROOT / "tests" / "integrations"))  # the end-to-end test's example settings

from common import machine, write_json  # noqa: E402
from test_verl_main_ppo import example_env, steps  # noqa: E402  (what the end-to-end test runs with)

PARTS = "verl_cpu_scale_parts"
ARM_ENV = "VERL_CPU_SCALE_ARM"  # verl_cpu_scale_parts.ARM_ENV (that module imports verl: not imported here)
ARMS = ("trace", "trace_alloc", "verl_grpo_tool_agent")
TOOLS_YAML = """tools:
  - class_name: verl_cpu_scale_parts.CorpusSearch
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: search
        description: Search the corpus for a query.
        parameters:
          type: object
          properties: {query: {type: string, description: the query}}
          required: [query]
"""


def common_overrides(base: Path, name: str, args: argparse.Namespace) -> list[str]:
    return [f"data.train_batch_size={args.prompts}", f"trainer.total_training_steps={args.steps}",
            "trainer.val_before_train=False", "trainer.save_freq=-1", "trainer.resume_mode=disable",
            f"trainer.default_local_dir={base / ('ckpt_' + name)}", f"hydra.run.dir={base / ('hydra_' + name)}",
            f"actor_rollout_ref.rollout.agent.num_workers={args.workers}"]


def trace_overrides(args: argparse.Namespace, credit: bool = True) -> list[str]:
    """TRACE's arm: ``credit`` as run.sh runs it (readiness on verl's reference worker), else
    ``trace_alloc`` (the same tree allocation, no readiness: no reference worker, no scoring)."""
    budget = args.prompts * args.group
    tracerl = [f"rollout.budget={budget}", f"rollout.pool_size={args.prompts}"]
    if args.turn_tokens:  # verl's tool loop caps a turn only by the response left: the same turns here
        tracerl.append(f"rollout.engine.max_turn_tokens={args.turn_tokens}")
    extra: list[str] = []
    if not credit:  # tracerl.yaml turns credit on: turn it off and train on tree_anchor advantages
        tracerl += ["algo.credit=false", "algo.estimator=tree_anchor"]
        extra = ["++tracerl.preset=trace_alloc", "++tracerl.readiness=in_process",
                 "algorithm.adv_estimator=tracerl_tree_anchor"]
    listed = ",".join(f"'{o}'" for o in tracerl)
    return [f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={PARTS}.TimedTraceManager",
            f"+tracerl.overrides=[{listed}]", "tracerl.check=false", *extra]


def react_prompts(run_dir: Path) -> Path:
    """``train.parquet`` with each prompt rendered as TRACE's manager renders it (tracerl's react
    format over the same tools: ``Question: ...``), so verl's loop starts from the text TRACE's
    episodes start from (the chat template of the tiny model writes message contents as they are).
    TRACE's manager reads ``extra_info.question`` and renders it itself."""
    import pandas as pd

    from tracerl.agent.formats import get_format
    from tracerl.config.schema import resolve_config
    from tracerl.core.types import Task
    from tracerl.train.data import load_task_data, run_environment

    cfg = resolve_config("trace", config_file=str(run_dir / "tracerl.yaml"))
    env = run_environment(load_task_data(cfg.data, cfg.rollout.engine, cfg.seed).documents, cfg.data, cfg.rollout.engine)
    fmt = get_format(cfg.model.format, system=cfg.model.system_prompt, tool_list=cfg.model.tool_list)
    frame = pd.read_parquet(run_dir / "data" / "train.parquet")
    frame["prompt"] = [[{"role": "user", "content": fmt.render_prompt(Task(id="q", question=e["question"], answers=("",)),
                                                                     env.tools)}] for e in frame["extra_info"]]
    out = run_dir / "data" / "train_react.parquet"
    frame.to_parquet(out)
    return out


def verl_overrides(base: Path, args: argparse.Namespace) -> list[str]:
    tools = base / "tools.yaml"
    tools.write_text(TOOLS_YAML)
    rollout = "actor_rollout_ref.rollout"
    return [f"data.train_files={react_prompts(base / 'run')}",
            f"{rollout}.agent.agent_loop_manager_class={PARTS}.TimedVerlManager",
            "algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=sync", f"{rollout}.n={args.group}",
            f"{rollout}.agent.default_agent_loop=tool_agent", f"{rollout}.multi_turn.enable=True",
            f"{rollout}.multi_turn.format=tracerl_react", f"{rollout}.multi_turn.tool_config_path={tools}",
            f"{rollout}.multi_turn.max_assistant_turns={args.turns}",
            *([f"data.max_response_length={args.verl_response_length}"] if args.verl_response_length else []),
            f"reward.custom_reward_function.path={HERE / (PARTS + '.py')}", "reward.custom_reward_function.name=compute_score"]


def run(out: Path, name: str, env: dict[str, str],
        overrides: list[str]) -> tuple[list[dict[str, Any]], dict[int, dict[str, float]]]:
    """One main_ppo run: its timed batches (``VERL_CPU_SCALE`` lines) and verl's console metrics;
    its log goes to ``{name}.log`` beside ``out``."""
    done = subprocess.run(["bash", str(EXAMPLE / "run.sh"), str(out), *overrides], env=env, capture_output=True,
                          text=True, timeout=3600)
    log = done.stdout + done.stderr
    (out.parent / f"{name}.log").write_text(log)
    if done.returncode != 0:
        sys.exit(log[-6000:])
    records = [json.loads(line.split("VERL_CPU_SCALE ", 1)[1]) for line in log.splitlines() if "VERL_CPU_SCALE " in line]
    return records, steps(log)


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    sampled, seconds = sum(r["sampled_tokens"] for r in records), sum(r["seconds"] for r in records)
    tokens, samples = sum(r["sample_tokens"] for r in records), sum(r["samples"] for r in records)
    out = {"steps": len(records), "sampled_tokens": sampled, "sample_tokens": tokens, "samples": samples,
           "seconds": seconds, "sample_tokens_per_sample": tokens / max(samples, 1),
           "rollout_tokens_per_s": sampled / max(seconds, 1e-9), "sample_tokens_per_s": tokens / max(seconds, 1e-9),
           "taskrunner_peak_rss_mb": max((r["taskrunner_peak_rss_mb"] for r in records), default=None),
           "after_step_1": _rate(records[1:])}
    if records and records[0].get("generation_seconds") is not None:  # TRACE: where its step's time went
        generation = sum(r["generation_seconds"] or 0.0 for r in records)
        readiness = sum(r["readiness_seconds"] or 0.0 for r in records)
        out.update({"generation_seconds": generation, "readiness_seconds": readiness,
                    "other_seconds": seconds - generation - readiness,
                    # TRACE's rollout machinery alone: sampled tokens over the time its trees were expanding
                    "generation_tokens_per_s": sampled / max(generation, 1e-9)})
    out["per_step"] = records
    return out


def _rate(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """Sampled tokens per second over ``records`` (None when empty)."""
    if not records:
        return None
    sampled, seconds = sum(r["sampled_tokens"] for r in records), sum(r["seconds"] for r in records)
    tokens, samples = sum(r["sample_tokens"] for r in records), sum(r["samples"] for r in records)
    out = {"sampled_tokens": sampled, "seconds": seconds, "rollout_tokens_per_s": sampled / max(seconds, 1e-9),
           "sample_tokens_per_s": tokens / max(seconds, 1e-9), "samples_per_s": samples / max(seconds, 1e-9)}
    if records[0].get("generation_seconds") is not None:  # TRACE's expansion alone
        out["generation_tokens_per_s"] = sampled / max(sum(r["generation_seconds"] or 0.0 for r in records), 1e-9)
    return out


def ratios(arm: dict[str, Any], verl: dict[str, Any]) -> dict[str, float | None]:
    """``arm``'s rates over verl's: whole rollout, after step 1, and (TRACE) generation alone."""
    def over(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / max(b, 1e-9)

    mine, theirs = arm.get("after_step_1") or {}, verl.get("after_step_1") or {}
    return {"tokens_per_s": over(arm["rollout_tokens_per_s"], verl["rollout_tokens_per_s"]),
            "after_step_1": over(mine.get("rollout_tokens_per_s"), theirs.get("rollout_tokens_per_s")),
            # after step 1 (verl's first step carries its start-up)
            "generation_only_after_step_1": over(mine.get("generation_tokens_per_s"), theirs.get("rollout_tokens_per_s")),
            # a tree samples its shared turns once, so its leaves' tokens outnumber what it sampled:
            # the samples' tokens (and the samples) delivered per second, after step 1
            "sample_tokens_per_s_after_step_1": over(mine.get("sample_tokens_per_s"), theirs.get("sample_tokens_per_s")),
            "samples_per_s_after_step_1": over(mine.get("samples_per_s"), theirs.get("samples_per_s"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8, help="prompts a step (data.train_batch_size)")
    parser.add_argument("--group", type=int, default=4, help="GRPO's rollout.n; TRACE's budget is prompts x group")
    parser.add_argument("--workers", type=int, default=2, help="agent-loop workers of each side")
    parser.add_argument("--turns", type=int, default=3, help="verl's max_assistant_turns (TRACE's max_turns in prepare.py)")
    parser.add_argument("--turn-tokens", type=int, default=384,
                        help="TRACE's rollout.engine.max_turn_tokens (384: run.sh's response length, no cap of its "
                             "own, as verl's tool loop; 0: tracerl.yaml's 16)")
    parser.add_argument("--verl-response-length", type=int, default=0,
                        help="verl's data.max_response_length (0: run.sh's, TRACE's max_total_tokens)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the runs to make, in order")
    parser.add_argument("--dry-run", action="store_true", help="print the result, write nothing")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="verl_cpu_scale_"))
    env = example_env(base / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    env["TRACERL_SCALE_CONFIG"] = str(base / "run" / "tracerl.yaml")
    subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), str(base / "run")], env=env, check=True,
                   capture_output=True)
    arms: dict[str, dict[str, Any]] = {}
    metrics: dict[str, dict[int, dict[str, float]]] = {}
    for arm in args.arms:  # one main_ppo run each, one after another
        if arm == "verl_grpo_tool_agent":
            overrides = verl_overrides(base, args)
        else:
            overrides = trace_overrides(args, credit=arm == "trace")
        records, metrics[arm] = run(base / "run", arm, {**env, ARM_ENV: arm}, common_overrides(base, arm, args) + overrides)
        arms[arm] = summary(records)
    verl = arms.get("verl_grpo_tool_agent")
    trace = arms.get("trace")
    result: dict[str, Any] = {
        "what": "TRACE's manager (with credit: trace; without: trace_alloc, the same allocation, no readiness) "
                "against verl's tool_agent loop with GRPO inside verl 0.9.1 main_ppo on the CPU "
                f"({args.workers} agent-loop workers, 2 tracerl_hf rollout replicas, {args.prompts} prompts x "
                f"{args.group} samples a step, {args.steps} steps)",
        "command": "HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled .venv-verl/bin/python benchmarks/systems/verl_cpu_scale.py "
                   + " ".join(sys.argv[1:]),
        "machine": machine(), **arms,
        "goal_ratio": 0.8,
        "verl_max_assistant_turns": args.turns,
    }
    if verl is not None:
        # ratios (TRACE arm over verl): tokens_per_s over the whole rollout (TRACE's includes planning and, with
        # credit, readiness scoring on verl's reference worker); after_step_1 leaves out step 1, which carries
        # verl's start-up (its agent loops and reward workers warming up; the tree workers are built before step 1);
        # generation_only: TRACE's sampled tokens over the seconds its trees were expanding; sample_tokens and
        # samples per second: what each delivers to the trainer (a tree's shared turns count in each leaf)
        result["ratios"] = {arm: ratios(arms[arm], verl) for arm in arms if arm != "verl_grpo_tool_agent"}
        result["sample_tokens_verl_over_trace"] = {
            arm: verl["sample_tokens"] / max(arms[arm]["sample_tokens"], 1) for arm in arms if arm != "verl_grpo_tool_agent"}
    if trace is not None and trace["per_step"]:
        last = trace["per_step"][-1]
        result["readiness_tokens"] = {"forwarded": last["readiness_tokens_forwarded"],
                                      "full_prefix": last["readiness_tokens_full_prefix"]}
        result["trace_tree_workers_busy"] = metrics["trace"].get(args.steps, {}).get("tracerl/tree_workers_busy")
    result["note"] = ("rates are sampled tokens over the wall time from generate_sequences until the batch is finished; "
                      "read the ratios after step 1: verl's step 1 holds seconds of its loop's start-up; "
                      "the 0.08M-parameter model does not learn the tool protocol, so turns, tool calls and tokens per "
                      "sample differ between the loops")
    print(json.dumps(result, indent=2))
    if not args.dry_run:
        print(write_json(ROOT / "benchmarks" / "results" / "verl_cpu_scale.json", result))


if __name__ == "__main__":
    main()
