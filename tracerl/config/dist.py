"""The ``dist`` config section: training over several processes with FSDP2 (distributed/fsdp.py).

Checked at config load with the rest of the config; torch.distributed is not imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracerl.config.loading import ConfigError

DIST_BACKENDS = ("auto", "gloo", "nccl")
MIXED_PRECISION = ("auto", "bf16", "fp32")


@dataclass
class DistConfig:
    """Sharded training: ``nproc`` processes (one per GPU), rank 0 the driver."""

    nproc: int = 1
    """Training processes. 1 trains in this process (no torch.distributed). N > 1 launches N
    processes through torchrun (``tracerl train PRESET --nproc N``), or runs under a torchrun that
    started N: rank 0 plans, samples, scores and logs; every rank holds a shard of the policy."""
    backend: str = "auto"
    """Process-group backend: ``auto`` (NCCL when ``model.device`` is CUDA, gloo on the CPU),
    ``gloo`` or ``nccl`` (CUDA only)."""
    timeout_s: float = 600.0
    """Seconds a collective (the sharded update, a sharded save or load) may wait for the other
    ranks, and seconds ranks > 0 wait without a heartbeat from rank 0 (it beats every
    ``min(2, timeout_s / 4)`` s) before the run fails. Rank 0's own phases (sampling, scoring,
    evaluation, checkpoints) do not count: the other ranks wait for its next command outside any
    collective while it beats."""
    mixed_precision: str = "auto"
    """FSDP's precision policy: ``bf16`` (parameters gathered in bfloat16, gradients reduced in
    float32; master weights and AdamW state stay float32 shards), ``fp32`` (float32 throughout) or
    ``auto`` (``bf16`` when ``model.dtype = bfloat16``)."""

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 1:
            raise ConfigError(f"dist.nproc must be an integer >= 1, got {self.nproc!r}")
        if self.backend not in DIST_BACKENDS:
            raise ConfigError(f"dist.backend = {self.backend!r} is not valid; allowed values: "
                              f"{', '.join(DIST_BACKENDS)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"dist.mixed_precision = {self.mixed_precision!r} is not valid; allowed values: "
                              f"{', '.join(MIXED_PRECISION)}")
        if not self.timeout_s > 0:
            raise ConfigError(f"dist.timeout_s must be > 0 seconds, got {self.timeout_s}")

    def fsdp_dtype(self, model_dtype: str) -> str:
        """The working dtype FSDP gathers parameters in: ``bfloat16`` or ``float32``."""
        if self.mixed_precision == "bf16" or (self.mixed_precision == "auto" and model_dtype == "bfloat16"):
            return "bfloat16"
        return "float32"


def check_dist(config: Any) -> None:
    """What the sharded path supports, checked with the whole config (``config`` is a TrainConfig)."""
    d, m = config.dist, config.model
    cuda = m.device.startswith("cuda")
    if d.backend == "nccl" and not cuda:
        raise ConfigError(f"dist.backend = 'nccl' needs model.device = 'cuda' (got {m.device!r}); "
                          "use dist.backend = 'gloo' or 'auto' on the CPU")
    if d.mixed_precision == "bf16" and m.dtype == "float16":
        raise ConfigError("dist.mixed_precision = 'bf16' contradicts model.dtype = 'float16'; "
                          "use model.dtype = 'bfloat16'")
    if d.nproc == 1:
        return
    if m.lora.r > 0:
        raise ConfigError(f"dist.nproc = {d.nproc} does not work with a LoRA adapter (model.lora.r > 0) yet: "
                          "sharded training updates full weights; use dist.nproc = 1 for LoRA")
    if m.dtype == "float16":
        raise ConfigError(f"dist.nproc = {d.nproc} does not support model.dtype = 'float16' (its loss scaler "
                          "is per process); use model.dtype = 'bfloat16'")
    if cuda and m.device not in ("cuda", "cuda:0"):
        raise ConfigError(f"dist.nproc = {d.nproc} places rank r on GPU LOCAL_RANK; model.device = {m.device!r} "
                          "must be 'cuda'")
