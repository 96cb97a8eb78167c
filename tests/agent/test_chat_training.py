"""A local Hugging Face checkpoint with its own chat template trains with ``model.format=chat``."""

from __future__ import annotations

import math
from pathlib import Path

from helpers_chat import chat_tokenizer
from helpers_tiny import tiny_model

from tracerl.agent.chat_template import ChatTemplateFormat
from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import read_metrics


def test_trace_trains_a_local_checkpoint_with_its_chat_template(tmp_path: Path) -> None:
    tok = chat_tokenizer()
    checkpoint = tmp_path / "ckpt"
    tiny_model(len(tok), seed=1).save_pretrained(checkpoint)
    tok.save_pretrained(checkpoint)
    config = resolve_config("trace", smoke="random", overrides=[
        f"model.name_or_path={checkpoint}", "model.format=chat", "model.system_prompt=Answer briefly.",
        "data.verifier=answered", "eval.every=0", "steps=1", "rollout.engine.max_turn_tokens=8"])
    trainer = Trainer(config, tmp_path / "run")
    assert isinstance(trainer.fmt, ChatTemplateFormat) and trainer.fmt.system == "Answer briefly."
    trainer.run()
    record = read_metrics(tmp_path / "run")[-1]
    assert record["step"] == 1 and math.isfinite(record["loss"])
    task = trainer.data.train[0]
    prompt = trainer.executor.engine.prompt_ids(task)
    assert tok.decode(prompt, skip_special_tokens=False).startswith("<|im_start|>system\nAnswer briefly.")
