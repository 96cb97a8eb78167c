"""Weight buckets in the policy's dtype: cast as each bucket is built, sized in that dtype."""

from __future__ import annotations

import torch

from tracerl.models.weights import weight_buckets


class Net(torch.nn.Module):
    """Two 'layers' of two 4-float tensors (16 bytes each in float32, 8 in bf16) and a step counter."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.full((4,), 1 / 3)),
                                                                  "b": torch.nn.Parameter(torch.full((4,), 2 / 3))})
                                          for _ in range(2))
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int64))


def test_floating_tensors_are_cast_and_integer_buffers_kept() -> None:
    net = Net()
    (bucket,) = list(weight_buckets(net, bucket_bytes=1000, dtype=torch.bfloat16))
    tensors = dict(bucket)
    assert [t.dtype for n, t in bucket if n != "steps"] == [torch.bfloat16] * 4
    assert tensors["steps"].dtype == torch.int64 and tensors["steps"].item() == 7
    assert torch.equal(tensors["layers.0.a"], torch.full((4,), 1 / 3).to(torch.bfloat16))
    assert net.layers[0]["a"].dtype == torch.float32  # the model itself is not touched
    assert sum(t.numel() * t.element_size() for t in tensors.values() if t.is_floating_point()) == 16 * 2


def test_bucket_budget_counts_the_cast_size() -> None:
    # 40 bytes, the buffer first (state-dict order): float32 8 + 32 (layers.0) fits, layers.1 (32)
    # does not; in bf16 8 + 16 + 16 = 40: everything is one bucket
    names = lambda buckets: [[n for n, _ in b] for b in buckets]  # noqa: E731
    assert names(weight_buckets(Net(), bucket_bytes=40)) == [["steps", "layers.0.a", "layers.0.b"],
                                                            ["layers.1.a", "layers.1.b"]]
    assert names(weight_buckets(Net(), bucket_bytes=40, dtype=torch.bfloat16)) == \
        [["steps", "layers.0.a", "layers.0.b", "layers.1.a", "layers.1.b"]]
