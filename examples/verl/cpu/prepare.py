"""Everything a CPU run of verl's own trainer with TRACE needs, in one folder (about a minute).

    python examples/verl/cpu/prepare.py OUT

writes ``OUT/model`` (tracerl's smoke tiny model: a 0.08M-parameter Qwen3 pretrained once, about
30 s on one core, then cached), ``OUT/data/{train,val}.parquet`` (SynthWiki questions in verl's
layout: ``prompt``, ``data_source``, ``reward_model.ground_truth``, ``extra_info.question``) and
``OUT/tracerl.yaml`` (the manager's side: format, tools and corpus, TRACE with budget 10, the
predictor, credit). The questions come from the same data the manager's environment serves, so
every one is answerable from its corpus. ``examples/verl/cpu/run.sh OUT`` then runs verl.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd
import yaml

from tracerl.config.loading import merge
from tracerl.config.presets import SMOKE
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.train.data import load_task_data
from tracerl.train.smoke import ensure_smoke_model

BUDGET = 10
"""Leaves per step: not a multiple of the mini-batch of 4, so verl pads every step with 2 rows."""


def write_tracerl_config(path: Path) -> TrainConfig:
    """The manager's tracerl YAML at ``path`` (``--smoke``'s tiny world and limits, TRACE with
    credit), resolved as the manager will resolve it."""
    overlay = merge(SMOKE, {"rollout": {"scheme": "trace", "budget": BUDGET, "pool_size": 4,
                                        "engine": {"max_turns": 3, "max_total_tokens": 384},
                                        "schemes": {"group_size": 3}},
                            "model": {"threads": 1}, "data": {"train_worlds": 1},
                            "algo": {"estimator": "trace_credit", "credit": True},
                            "predictor": {"features": "handcrafted"}})
    for key in ("name_or_path", "tiny_preset"):  # the model is verl's actor_rollout_ref.model.path
        overlay["model"].pop(key)
    overlay.pop("steps")  # verl counts the steps
    overlay.pop("optim")  # verl's actor trains (actor_rollout_ref.actor); the manager refuses tracerl optim settings
    path.write_text(yaml.safe_dump(overlay, sort_keys=False))
    return resolve_config("trace", config_file=str(path))


def rows(tasks: list, split: str) -> list[dict]:
    return [{"data_source": "synthwiki", "prompt": [{"role": "user", "content": t.question}], "ability": "qa",
             "reward_model": {"style": "rule", "ground_truth": list(t.answers)},
             "extra_info": {"index": i, "split": split, "question": t.question}} for i, t in enumerate(tasks)]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = ensure_smoke_model(lambda text: print(text, end="", flush=True))
    shutil.copytree(model, out / "model", dirs_exist_ok=True)
    config = write_tracerl_config(out / "tracerl.yaml")
    data = load_task_data(config.data, config.rollout.engine, config.seed)
    (out / "data").mkdir(exist_ok=True)
    pd.DataFrame(rows(data.train[:16], "train")).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame(rows(data.held_out[:4], "val")).to_parquet(out / "data" / "val.parquet")
    print(f"{out}: model/, data/train.parquet ({min(16, len(data.train))} questions), data/val.parquet, tracerl.yaml")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/verl/cpu/prepare.py OUT")
    main(Path(sys.argv[1]))
