"""Which rows of a weight each FSDP rank reads, and the folders sharded loading refuses (one process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracerl.distributed.shard_load import ShardLoadError, shard_rows, weight_files


@pytest.mark.parametrize("length,world", [(10, 2), (301, 2), (5, 4), (3, 8), (0, 2), (16, 8), (17, 8)])
def test_rows_are_torch_chunk_of_dim_0(length: int, world: int) -> None:
    chunks = torch.arange(length).chunk(world) if length else ()
    for rank in range(world):
        start, stop = shard_rows(length, world, rank)
        expected = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(range(start, stop)) == expected


def test_hand_computed_rows() -> None:
    # 301 rows over 2 ranks: chunks of 151; 5 rows over 4 ranks: chunks of 2, the last rank holds none
    assert [shard_rows(301, 2, r) for r in range(2)] == [(0, 151), (151, 301)]
    assert [shard_rows(5, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]


def test_a_folder_without_safetensors_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ShardLoadError, match="no model.safetensors") as err:
        weight_files(tmp_path)
    assert "\n" not in str(err.value)


def test_a_broken_index_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ShardLoadError, match="model.safetensors.index.json: not a safetensors index"):
        weight_files(tmp_path)


def test_checkpoints_stored_under_other_names_are_loaded_whole(tmp_path: Path) -> None:
    """A safetensors file whose names are not the model's (as a checkpoint transformers converts on
    load): shard-by-shard reading is not possible, and the reason names the folder and a weight."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    from tracerl.distributed.shard_load import whole_load_reason

    config = Qwen3Config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    config.save_pretrained(tmp_path)
    save_file({"transformer.wte.weight": torch.zeros(40, 16)}, str(tmp_path / "model.safetensors"))
    reason = whole_load_reason(tmp_path)
    assert reason is not None and str(tmp_path) in reason and "stored under other names" in reason
    assert "'model.embed_tokens.weight'" in reason


def test_the_sync_bucket_size_is_checked_at_config_load() -> None:
    from tracerl.config.loading import ConfigError
    from tracerl.config.schema import resolve_config

    assert resolve_config("grpo", overrides=["rollout.sync_bucket_mb=16"]).rollout.sync_bucket_mb == 16
    with pytest.raises(ConfigError, match="rollout.sync_bucket_mb must be an integer >= 1, got 0"):
        resolve_config("grpo", overrides=["rollout.sync_bucket_mb=0"])
