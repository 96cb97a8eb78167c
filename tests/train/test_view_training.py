"""A tiny trace_credit run end to end: the V_k, c_k and A_out its rollout records hold are the ones the
estimator trained with, and ``tracerl view`` renders the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.rollout_log import read_step

TINY = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0", "eval.size=2",
        "steps=1", "rollout.budget=8", "rollout.pool_size=2"]


@pytest.mark.slow
def test_recorded_credit_is_what_trace_credit_trained_with(tmp_path: Path) -> None:
    config = resolve_config("trace_credit", smoke="random", overrides=TINY)
    Trainer(config, tmp_path).run()
    options = config.algo.advantage
    transitions = 0
    for tree in read_step(tmp_path, 1):
        assert tree["credit_options"]["w_turn"] == options.w_turn and tree["credit_options"]["value"] == "log_ratio"
        kinds = {n["id"]: n["action"] for n in tree["nodes"]}
        for traj in tree["trajectories"]:
            if traj["infra_failed"]:
                continue
            a_out, credit, k = traj["outcome_advantage"], traj["credit"], 0
            assert len(traj["values"]) == len(traj["readiness"]) == len(credit) + 1 and traj["values"][0] == 0.0
            # chains: the tree-aware outcome term is A_out itself; transition k adds w_turn * c_k
            for nid, advantage in zip(traj["node_path"][1:], traj["turn_advantage"], strict=True):
                expected = options.w_out * a_out
                if kinds[nid] != "answer":
                    expected, k = expected + options.w_turn * credit[k], k + 1
                assert advantage == pytest.approx(expected, abs=1e-4)
            transitions += k
    assert transitions > 0  # the dense term was exercised
    result = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 0 and "c<sub>k</sub> credit" in (tmp_path / "view" / "step-000001.html").read_text()
