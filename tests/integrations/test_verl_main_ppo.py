"""verl's own trainer with TRACE, end to end on the CPU (run with `make test-verl`; skipped where verl
is missing): `python -m verl.trainer.main_ppo` with the `tracerl_sync` trainer, the
`TraceAgentLoopManager`, `tracerl_trace_credit` and tracerl's HF rollout server (`tracerl_hf`), on
the smoke tiny model, exactly as `examples/verl/cpu/{prepare.py,run.sh}` run it: two actor ranks and
so two rollout replicas, the trees expanded on two agent-loop workers (`agent.num_workers=2`),
readiness scored on verl's reference worker (`+tracerl.readiness=reference_worker`), checked against
tracerl's own HF reference and estimator in the run (`+tracerl.check=true`).

Two runs: 2 steps straight (a validation first, a checkpoint each step); then, with the step-2
checkpoint removed and the step-1 one marked latest, a resume (``resume_mode=auto``) to step 2. Step 2 of the resumed run must equal
step 2 of the straight one exactly in every metric that is not a clock reading or the sampler's
float noise (:data:`SAMPLER_FLOAT`): rewards, tokens, advantages, losses, gradient norm, and the
predictor's loss and Brier score (the predictor comes back from the step-1 folder)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verl" / "cpu"
BUDGET, PADDED = 10, 12  # leaves a step; verl pads to a multiple of ppo_mini_batch_size = 4
CLOCK = re.compile(r"timing|time|throughput|perf/|_per_s|seconds|mfu|memory")
"""Metric names that read a clock or the machine, left out of the exact comparison."""
SAMPLER_FLOAT = re.compile(r"^rollout_corr/|^training/rollout_")
"""Statistics of the servers' sampling-time log-probs against the actor's: the HF server samples
the requests that arrive together as one batch, and a batch's composition moves its log-probs at
float precision (about 1e-7, two fresh runs differ as much), never its tokens; left out too."""


def example_env(cache: Path) -> dict[str, str]:
    """The environment ``examples/verl/cpu`` runs in here: caches under ``cache``, this Python, no
    inherited Ray address or verl settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VERL_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": str(cache), "PYTHON": sys.executable,
            "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _run(out: Path, env: dict[str, str], *overrides: str) -> str:
    done = subprocess.run(["bash", str(EXAMPLE / "run.sh"), str(out), *overrides], env=env, capture_output=True,
                          text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    return log


def steps(log: str) -> dict[int, dict[str, float]]:
    """verl's console metrics: ``step:N - key:value - ...`` records, values as floats (the last
    number of a value: ``np.float64(0.5)`` is 0.5). Ray can deliver two records on one line."""
    out: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        for found in re.finditer(r"step:(\d+) - (.*?)(?=step:\d+ - |$)", line):
            metrics = out.setdefault(int(found.group(1)), {})
            for item in found.group(2).split(" - "):
                key, _, value = item.partition(":")
                numbers = re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf", value)
                if numbers:
                    metrics[key.strip()] = float(numbers[-1])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("verl_e2e")
    env = example_env(base / "cache")
    prepared = subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), str(base / "straight")], env=env,
                              capture_output=True, text=True, timeout=600)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    first = _run(base / "straight", env)
    ckpt = base / "straight" / "ckpt"
    latest = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    saved = {step: sorted(p.name for p in (ckpt / f"global_step_{step}").iterdir()) for step in (1, 2)}
    shutil.rmtree(ckpt / "global_step_2")  # as if the first run had stopped after step 1
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1")
    resumed = _run(base / "straight", env)
    return first, steps(first), latest, saved, resumed, steps(resumed)


def test_two_steps_a_validation_and_a_checkpoint(runs) -> None:
    first, metrics, latest, saved, _, _ = runs
    assert "Initial validation metrics" in first and sorted(metrics) == [0, 1, 2]
    assert "val-core/synthwiki/reward/mean@1" in metrics[0]
    assert "LLMServerManager: ['tracerl_hf-0', 'tracerl_hf-1']" in first  # two rollout replicas
    assert all(metrics[step]["tracerl/tree_workers"] == 2 for step in (1, 2))  # trees on two agent-loop workers
    assert latest == "2"
    for step in (1, 2):
        assert "tracerl_predictor.pt" in saved[step] and "actor" in saved[step], saved


def test_every_leaf_advantage_is_tracerls_readiness_is_the_references_and_padding_weighs_nothing(runs) -> None:
    _, straight, _, _, _, _ = runs
    for step in (1, 2):
        m = straight[step]
        assert m["tracerl/advantage_max_abs_diff"] == 0.0, (step, m["tracerl/advantage_max_abs_diff"])
        assert (m["tracerl/trained_leaves"], m["tracerl/padding_rows"], m["tracerl/leaves"]) == (BUDGET, PADDED - BUDGET,
                                                                                                  BUDGET)
        # readiness scored on verl's reference worker equals tracerl's HF ReferenceScorer
        assert m["tracerl/reference_rows"] > 0 and m["tracerl/readiness_max_abs_diff"] <= 1e-5, m
    assert max(straight[s]["tracerl/advantage_max_abs"] for s in (1, 2)) > 0  # the check compared something


def test_the_resumed_run_continues_exactly(runs) -> None:
    _, straight, _, _, log, resumed = runs
    assert "Resuming from" in log and "global_step_1" in log
    assert sorted(resumed) == [1, 2] and all(k.startswith("val-") for k in resumed[1])  # validation, then step 2
    want = {k: v for k, v in straight[2].items() if not CLOCK.search(k) and not SAMPLER_FLOAT.search(k)}
    got = {k: v for k, v in resumed[2].items() if not CLOCK.search(k) and not SAMPLER_FLOAT.search(k)}
    assert {"tracerl/brier", "tracerl/generated_tokens", "actor/pg_loss", "actor/grad_norm"} <= set(want)
    differ = {k: (want[k], got.get(k)) for k in want if not (want[k] == got.get(k) or (want[k] != want[k] and
                                                                                          got.get(k) != got.get(k)))}
    assert differ == {}


def test_the_cpu_adapter_refuses_another_verl() -> None:
    from tracerl.errors import UserError
    from tracerl.integrations.verl import cpu

    cpu.check_version()  # the installed verl is the pinned one
    with pytest.raises(UserError, match=r"adapts verl 0\.9\.1, found verl 0\.9\.2"):
        cpu.check_version("0.9.2")
