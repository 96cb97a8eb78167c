"""Weights as (name, tensor) buckets: whole layers per bucket, tied aliases once, loaded by name."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.weights import layer_key, load_buckets, weight_buckets


class Net(torch.nn.Module):
    """Two 'layers' of two 4-float tensors (16 bytes each) and a head."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.full((4,), fill)),
                                                                  "b": torch.nn.Parameter(torch.full((4,), fill))})
                                          for _ in range(2))
        self.head = torch.nn.Linear(2, 2, bias=False)  # 4 floats


def test_buckets_hold_whole_layers_up_to_the_byte_budget() -> None:
    net = Net(1.0)
    buckets = list(weight_buckets(net, bucket_bytes=20))
    # layers.0 is 32 bytes, over the budget, but a layer is never split; then 32 and 16 bytes.
    assert [[n for n, _ in b] for b in buckets] == [["layers.0.a", "layers.0.b"], ["layers.1.a", "layers.1.b"],
                                                   ["head.weight"]]
    assert [[n for n, _ in b] for b in weight_buckets(net, bucket_bytes=64)] == \
           [["layers.0.a", "layers.0.b", "layers.1.a", "layers.1.b"], ["head.weight"]]
    assert layer_key("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert layer_key("model.embed_tokens.weight") == "model.embed_tokens"


def test_tied_weights_go_once_and_load_by_name() -> None:
    tok = bpe_tokenizer()
    source, target = tiny_model(len(tok), seed=1), tiny_model(len(tok), seed=2)
    names = [n for b in weight_buckets(source, bucket_bytes=4096) for n, _ in b]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: once
    assert len(names) == len(set(names))
    assert load_buckets(target, weight_buckets(source, bucket_bytes=4096)) == len(names)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert target.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="no parameter 'nope.weight'"):
        load_buckets(target, [[("nope.weight", torch.zeros(1))]])


def test_hf_backend_takes_buckets() -> None:
    tok = bpe_tokenizer()
    policy = HFPolicy(tiny_model(len(tok), seed=1), tok)
    params = SamplingParams(max_new_tokens=6)
    before = policy.generate([[5, 6, 7]], params, [3])[0]
    assert policy.store is not None and len(policy.store) > 0
    policy.sync_weights(weight_buckets(tiny_model(len(tok), seed=2), bucket_bytes=8192), version=3)
    assert policy.version == 3 and len(policy.store) == 0
    after = policy.generate([[5, 6, 7]], params, [3])[0]
    reference = HFPolicy(tiny_model(len(tok), seed=2), tok).generate([[5, 6, 7]], params, [3])[0]
    assert after.token_ids == reference.token_ids and after.logprobs != before.logprobs


def test_a_sharded_parameter_is_unsharded_in_its_bucket() -> None:
    """A DTensor (one-process gloo group) leaves as the whole plain tensor."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        sharded = distribute_tensor(torch.arange(6.0).reshape(2, 3), init_device_mesh("cpu", (1,)), [Shard(0)])
        assert isinstance(sharded, DTensor)
        (bucket,) = weight_buckets({"layers.0.w": sharded}, bucket_bytes=1)
        (name, tensor), = bucket
        assert name == "layers.0.w" and not isinstance(tensor, DTensor)
        assert tensor.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    finally:
        dist.destroy_process_group()
