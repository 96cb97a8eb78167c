"""rollout.executor and WorkerSpec: an executor built from plain data equals the trainer's own."""

from __future__ import annotations

import json
import pickle

import pytest
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.agent.formats import get_format
from tracerl.core.protocol import StartRequest, task_record, to_json
from tracerl.config.schema import ConfigError, resolve_config
from tracerl.train.data import load_task_data
from tracerl.train.executors import LiveParts, WorkerSpec, build_executor, worker_spec


def test_an_unknown_executor_fails_at_config_load_naming_the_field() -> None:
    assert resolve_config("grpo").rollout.executor == "local"
    with pytest.raises(ConfigError, match="rollout.executor = 'rey' is not valid; allowed values: local, ray"):
        resolve_config("grpo", overrides=["rollout.executor=rey"])


def test_an_executor_built_from_a_pickled_spec_equals_one_sharing_the_trainers_parts(tmp_path) -> None:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok), seed=3)
    model.save_pretrained(tmp_path / "initial")
    tok.save_pretrained(tmp_path / "initial")
    config = resolve_config("grpo", smoke="random")
    spec = pickle.loads(pickle.dumps(worker_spec(config, tmp_path / "initial", worker="w1", version=2)))
    assert isinstance(spec, WorkerSpec) and json.loads(json.dumps(spec.config)) == spec.config  # plain data
    remote = build_executor(spec)  # loads the initial policy and builds its own environment
    assert (remote.worker, remote.version) == ("w1", 2) and remote.eval_engine is not None
    fmt = get_format(config.model.format, tokenizer=tok)
    data = load_task_data(config.data, config.rollout.engine, config.seed)
    local = build_executor(spec, LiveParts(model, tok, fmt, data.environment))
    assert local.backend.model is model  # the HF backend shares the trainer's model
    requests = [StartRequest("t", task_record(data.train[0]), 2, seed=5, version=2)]
    assert [to_json(d) for d in remote.start(requests).deltas] == [to_json(d) for d in local.start(requests).deltas]


def test_the_initial_policy_reaches_workers_as_an_absolute_folder(tmp_path, monkeypatch) -> None:
    """``--out runs/x`` with workers on an existing cluster: they run in another directory."""
    (tmp_path / "runs" / "x" / "initial").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    config = resolve_config("grpo", smoke="random")
    assert worker_spec(config, "runs/x/initial").initial_policy == str(tmp_path / "runs" / "x" / "initial")
    assert worker_spec(config, "Qwen/Qwen3-0.6B").initial_policy == "Qwen/Qwen3-0.6B"  # a hub name stays
