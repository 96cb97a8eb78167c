"""The memory estimate behind the "Which models fit" table of docs/gpu.md."""

from __future__ import annotations

import pytest

from tracerl.models.memory import GIB, QWEN3, ModelShape, activation_bytes, fits, training_memory_gib


@pytest.mark.parametrize("name, published", [("Qwen3-0.6B", 0.6e9), ("Qwen3-1.7B", 1.7e9), ("Qwen3-4B", 4.0e9),
                                             ("Qwen3-8B", 8.2e9), ("Qwen3-14B", 14.8e9)])
def test_parameter_counts_match_the_published_sizes(name: str, published: float) -> None:
    assert QWEN3[name].params() == pytest.approx(published, rel=0.03)


def test_hand_computed_small_shape() -> None:
    # 1 layer, hidden 4, 2 heads / 1 kv head of dim 2, MLP 8, vocab 10, tied embeddings.
    shape = ModelShape(hidden=4, layers=1, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10,
                       tied_embeddings=True)
    attn = 4 * 4 + 2 * (4 * 2) + 4 * 4  # q, k and v, o
    assert shape.params() == attn + 3 * 4 * 8 + 10 * 4
    assert shape.lora_params(rank=2) == 2 * ((4 + 4) + 2 * (4 + 2) + (4 + 4) + 2 * (4 + 8) + (8 + 4))
    tokens = 3
    act = activation_bytes(shape, tokens, chunk=2)
    assert act == 1 * 4 * 3 * 4 + 3 * (16 * 4 + 8 * 8) + 8 * 3 * 4 + 12 * 2 * 10
    full = training_memory_gib(shape, tokens=tokens, chunk=2)
    assert full["weights_and_optimizer"] * GIB == pytest.approx(18 * shape.params())
    assert full["reference"] * GIB == pytest.approx(2 * shape.params())
    assert full["total"] == pytest.approx(sum(v for k, v in full.items() if k != "total"))
    lora = training_memory_gib(shape, lora_rank=2, tokens=tokens, chunk=2)
    assert lora["reference"] == 0.0  # the reference is the base model with the adapter off
    assert lora["weights_and_optimizer"] * GIB == pytest.approx(2 * shape.params() + 16 * shape.lora_params(2))


def test_properties_of_the_table() -> None:
    for shape in QWEN3.values():
        full, lora = training_memory_gib(shape), training_memory_gib(shape, lora_rank=64)
        assert lora["total"] < full["total"]
        assert training_memory_gib(shape, checkpointing=False)["activations"] > full["activations"]
        assert training_memory_gib(shape, reference=False)["total"] < full["total"]
    # Full fine-tuning of 8B needs about 20 B/param = 150+ GiB: no single 141 GB GPU; 14B LoRA fits 80 GB.
    assert not fits(QWEN3["Qwen3-8B"], 141)
    assert fits(QWEN3["Qwen3-14B"], 80, lora_rank=64)
    assert fits(QWEN3["Qwen3-1.7B"], 80) and not fits(QWEN3["Qwen3-4B"], 80) and fits(QWEN3["Qwen3-4B"], 141)
