"""The length blow-up test (issue 51 item 13: the demo's generations grew from ~1.7k to 44k tokens
a step with zero reward and the guard did not act) and the rollback to the last good checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tracerl.config.divergence import DivergenceConfig
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.core.divergence import blow_up_onset
from tracerl.runs.divergence import DivergenceError, DivergenceMonitor, DivergenceRollback, tokens_per_rollout
from tracerl.runs.metrics import read_metrics
from tracerl.train.loop import Trainer


def test_blow_up_onset_by_hand() -> None:
    # baseline: median of [10, 12, 10, 11, 10] = 10, level 3 x 10 = 30; the last two (40, 50) reach it
    assert blow_up_onset([10, 12, 10, 11, 10, 40, 50], factor=3, patience=2, warmup=3, window=20) == 5
    # 29 < 30: the streak is one step long, not two
    assert blow_up_onset([10, 12, 10, 11, 10, 29, 50], factor=3, patience=2, warmup=3, window=20) is None
    # window 2: the baseline is the median of [11, 10] = 10.5, level 31.5 > 31
    assert blow_up_onset([10, 12, 10, 11, 10, 31, 50], factor=3, patience=2, warmup=2, window=2) is None
    # a single long step inside the baseline does not raise it: median of [10, 100, 10] = 10
    assert blow_up_onset([10, 100, 10, 35, 31], factor=3, patience=2, warmup=3, window=20) == 3
    # fewer than warmup values before the streak: no baseline yet
    assert blow_up_onset([10, 10, 40, 50], factor=3, patience=2, warmup=3, window=20) is None



# Generated tokens a step (128 rollouts each) of two demo runs (seed 0, issue 51), steps 22-44 of the
# run that collapsed (ungated turn term) and steps 24-45 of one that recovered from a spike (gated).
COLLAPSED = [1608, 1849, 1943, 1729, 1874, 1745, 1726, 2086, 2492, 1819, 2356, 1911, 1772, 2203, 3592, 2999,
             2704, 2723, 4338, 3688, 7317, 8432, 8351]
RECOVERED = [1557, 1324, 1218, 1284, 1276, 1262, 1312, 1551, 1978, 1301, 1260, 1222, 1644, 1597, 1410, 1247,
             1326, 1185, 1152, 3771, 8723, 1370]


def test_the_demo_collapse_is_caught_and_the_spike_is_not() -> None:
    """The collapse: steps 22-41 have the median 2014.5 (the mean of 1943 and 2086, the 10th and 11th
    of the 20 sorted), level 3 x 2014.5 = 6043.5; steps 42-44 (7317, 8432, 8351) all reach it: the
    onset is step 42, index 20. The spike: 3771 is under 3 x its median, and 8723 stands alone."""
    collapsed = [x / 128 for x in COLLAPSED]
    assert blow_up_onset(collapsed, factor=3, patience=3, warmup=3, window=20) == 20
    assert blow_up_onset(collapsed[:-1], factor=3, patience=3, warmup=3, window=20) is None  # 2 steps so far
    recovered = [x / 128 for x in RECOVERED]
    for end in range(4, len(recovered) + 1):  # as the monitor sees it, step by step
        assert blow_up_onset(recovered[:end], factor=3, patience=3, warmup=3, window=20) is None


def test_tokens_per_rollout() -> None:
    assert tokens_per_rollout({"generated_tokens": 2560, "rollouts": 128}) == 20.0
    assert tokens_per_rollout({"generated_tokens": 100, "rollouts": 0}) is None
    assert tokens_per_rollout({"rollouts": 8}) is None


def steps(tokens: list[int]) -> list[dict[str, Any]]:
    return [{"step": i + 1, "generated_tokens": t, "rollouts": 100} for i, t in enumerate(tokens)]


def test_the_monitor_names_a_length_blow_up_and_its_onset() -> None:
    """10-12 tokens a rollout for 5 steps (median 10), then 40, 50, 45: 3 steps at >= 3x (the defaults)."""
    monitor = DivergenceMonitor(DivergenceConfig(mode="rollback"), vocab_size=400)
    records = steps([1000, 1200, 1000, 1100, 1000, 4000, 5000, 4500])
    for record in records[:7]:
        monitor.observe(record, lambda: "")
    with pytest.raises(DivergenceRollback, match=r"at step 8: the generations grew to 45 tokens a rollout, 4\.5x their "
                                                 r"running median of 10, for 3 steps") as caught:
        monitor.observe(records[7], lambda: "")
    assert caught.value.onset == 6


def test_length_test_off_and_in_warn_mode(capsys: pytest.CaptureFixture[str]) -> None:
    off = DivergenceMonitor(DivergenceConfig(mode="stop", length_factor=0), vocab_size=400)
    for record in steps([1000, 1000, 1000, 1000, 9000, 9000, 9000]):
        off.observe(record, lambda: "")  # no test, no raise
    warn = DivergenceMonitor(DivergenceConfig(mode="warn"), vocab_size=400)
    for record in steps([1000, 1000, 1000, 1000, 9000, 9000, 9000, 9000]):
        warn.observe(record, lambda: "")
    lines = capsys.readouterr().err.strip().splitlines()  # steps 5-7 fire at 7; step 8 is the same kind: no line
    assert len(lines) == 1 and lines[0].startswith("warning: training diverged at step 7: the generations grew")
    with pytest.raises(ValueError, match="length_factor must be 0 \\(off\\) or > 1"):
        DivergenceConfig(length_factor=0.5)


CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3",
         "log.rollouts=true", "log.checkpoint_every=1", "log.keep_last=3", "optim.divergence.mode=rollback"]


@pytest.fixture(autouse=True, scope="module")
def _pretrained() -> None:
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))


def config(*extra: str) -> TrainConfig:
    return resolve_config("grpo", smoke="random", overrides=[*CHEAP, *extra])


def destroy(model: Any) -> None:
    """Every weight 0: every logit 0, so the policy samples the uniform distribution (what
    lr=1e30 does in test_divergence_stop.py), done between two steps."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()


def test_rollback_restores_the_last_good_checkpoint_and_keeps_the_diverged_records(tmp_path: Path) -> None:
    """Weights destroyed after step 4: step 5's rollouts are noise (the entropy test, onset 5).
    Step 5 was sampled from the weights after update 4, so ckpt-4 may hold the drift: the run
    goes back to ckpt-3, and steps 4-5 (metrics, rollouts, ckpt-4 and ckpt-5 if written) are
    moved into diverged-step-000005/, nothing deleted."""
    run = tmp_path / "run"
    with Trainer(config("steps=10"), run) as trainer:
        trainer.run(steps=4)
        destroy(trainer.model)
        trainer.executor.sync_weights(trainer.model, trainer.step_index)
        records = trainer.run()
        assert trainer.rolled_back is not None
        assert (trainer.rolled_back["fired_at"], trainer.rolled_back["onset"], trainer.rolled_back["to_step"]) == (5, 5, 3)
        assert trainer.step_index == 3
        restored = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert [r["step"] for r in records] == [5]  # the run ended at the rollback, no step 6
    assert (run / "LATEST").read_text() == "ckpt-000003"
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    aside = run / "diverged-step-000005"
    assert [json.loads(line)["step"] for line in (aside / "metrics.jsonl").read_text().splitlines()] == [4, 5]
    assert sorted(p.name for p in (aside / "rollouts").iterdir()) == ["step-000004.jsonl.gz", "step-000005.jsonl.gz"]
    assert (aside / "ckpt-000004").is_dir() and not (run / "ckpt-000004").exists()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000002", "ckpt-000003"]
    from safetensors.torch import load_file

    saved = load_file(str(run / "ckpt-000003" / "policy" / "model.safetensors"))
    for name, tensor in saved.items():
        assert torch.equal(restored[name], tensor), name  # the model in memory is ckpt-3's


def test_rollback_without_a_good_checkpoint_stops_in_one_line(tmp_path: Path) -> None:
    """lr=1e30: step 2's rollouts are noise (onset 2); a good checkpoint would be step 0: none."""
    with Trainer(config("optim.lr=1e30", "steps=6"), tmp_path / "run") as trainer, \
            pytest.raises(DivergenceError, match=r"training diverged at step 2: .* no checkpoint of step 0 or before "
                                                 r"is left to roll back to"):
        trainer.run()


def test_keep_last_keeps_that_many_checkpoints(tmp_path: Path) -> None:
    """The demo keeps 4 checkpoints (every 10 steps) so a rollback finds one from before a blow-up;
    the pruning kept 2 (a negative slice start while fewer than keep_last - 1 were older)."""
    from tracerl.runs.checkpoint import prune_checkpoints

    for step in range(10, 101, 10):
        (tmp_path / f"ckpt-{step:06d}").mkdir()
        prune_checkpoints(tmp_path, f"ckpt-{step:06d}", 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000070", "ckpt-000080", "ckpt-000090", "ckpt-000100"]
