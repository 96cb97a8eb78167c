"""The metric and config reference: every key a run writes and every config field has a meaning,
the generated docs/reference.md is current, and ``config show --explain`` reads back as the same config."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.schema import config_to_yaml, resolve_config
from tracerl.config.docs import attribute_docs, config_fields, explained_yaml, undocumented_fields
from tracerl.train.loop import Trainer
from tracerl.config.metric_docs import metric_doc, undocumented_metrics
from tracerl.config.reference import PAGE, reference_markdown

ROOT = Path(__file__).resolve().parents[2]
# One step of each scheme family, so every scheme_/predictor_/credit key appears: grpo with recomputed
# old log-probs (logprob_mismatch_*) and a step-0 evaluation, dapo (dropped groups), tree_random, trace.
RUNS = [("grpo", ["optim.recompute_old_logprobs=always", "eval.at_start=true"]), ("dapo", []),
        ("tree_grpo", []), ("trace", [])]


@pytest.fixture(scope="module")
def written_keys() -> set[str]:
    keys: set[str] = set()
    for preset, extra in RUNS:
        config = resolve_config(preset, smoke="random", overrides=[*extra, "steps=1", "eval.size=2",
                                                               "rollout.engine.max_turns=2"])
        with Trainer(config, Path(tempfile.mkdtemp()) / "run") as trainer:
            for record in trainer.run():
                keys |= set(record)
    return keys


def test_every_metric_key_a_run_writes_is_documented(written_keys: set[str]) -> None:
    assert {"predictor_brier", "scheme_informative_leaves", "readiness_gain_mean", "clip_fraction",
            "eval_accuracy_hops1", "logprob_mismatch_max", "scheme_dropped_groups"} <= written_keys
    assert undocumented_metrics(written_keys) == []


def test_the_key_check_can_fail_and_families_match_digits_only() -> None:
    assert undocumented_metrics({"step", "made_up_key", "eval_accuracy_hopsx"}) == ["eval_accuracy_hopsx", "made_up_key"]
    family = metric_doc("eval_accuracy_hops3")
    assert family is not None and family.pattern == "eval_accuracy_hops{k}"
    exact = metric_doc("time_rollout_execute")  # an exact entry beats the time_{phase} family
    assert exact is not None and exact.pattern == "time_rollout_execute"


def test_every_config_field_has_a_meaning() -> None:
    assert undocumented_fields() == []
    keys = {f.key for f in config_fields()}
    assert {"optim.lr", "rollout.schemes.group_size", "algo.advantage.horizon", "data.world.max_hops"} <= keys


def test_field_docstrings_are_read_from_the_source() -> None:
    from tracerl.config.schema import OptimConfig

    docs = attribute_docs(OptimConfig)
    assert docs["clip_low"] == docs["clip_high"] and "clip-higher" in docs["clip_high"]  # one docstring, two fields
    assert "lr" not in docs  # no docstring in the source: EXTRA_DOCS gives it


def test_generated_page_is_current() -> None:
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    assert committed == reference_markdown(), "docs/reference.md is stale: run tracerl config reference --out docs/reference.md"


def test_config_show_explain_comments_fields_and_reads_back(tmp_path: Path) -> None:
    config = resolve_config("trace", overrides=["optim.lr=1e-5"])
    text = explained_yaml(config)
    assert "  # Peak learning rate of AdamW. (default: 0.0003)\n  lr: 1.0e-05\n" in text
    path = tmp_path / "explained.yaml"
    path.write_text(text)
    assert yaml.safe_load(text)["optim"]["lr"] == 1e-5
    assert config_to_yaml(resolve_config("trace", config_file=path)) == config_to_yaml(config)
    result = CliRunner().invoke(app, ["config", "show", "trace", "--explain", "--set", "optim.lr=1e-5"])
    assert result.exit_code == 0 and result.stdout == text


def test_docs_trace_names_real_config_keys_beside_its_symbols() -> None:
    import re

    text = (ROOT / "docs" / "TRACE.md").read_text(encoding="utf-8")
    sections = ("data", "model", "rollout", "algo", "optim", "predictor", "eval", "log")
    named = set(re.findall(rf"`((?:{'|'.join(sections)})\.[a-z_.0-9]+)", text))
    keys = {f.key for f in config_fields()}
    assert {"algo.advantage.horizon", "algo.advantage.terminal_scale", "algo.advantage.gamma_td",
            "algo.advantage.w_turn", "algo.advantage.credit_eps", "rollout.budget",
            "rollout.schemes.trace_max_per_anchor"} <= named
    assert sorted(named - keys) == []
