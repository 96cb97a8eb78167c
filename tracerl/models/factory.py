"""Build the policy backend named by ``model.backend`` (``hf`` or ``vllm``).

vLLM is an optional extra: it is imported here only when asked for, so the core, the demo and
the default tests never import it. Config load already refused ``vllm`` when it is missing
(:class:`~tracerl.config.schema.ModelConfig`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tracerl.models.backend import HFPolicy, PolicyBackend
from tracerl.models import precision
from tracerl.models.decode_async import resolve_engine
from tracerl.models.precision import DTYPES

BACKENDS = ("hf", "vllm")


def vllm_missing(option: str = "model.backend") -> str:
    """The install message when ``option = 'vllm'`` is set without vLLM."""
    return f"{option} = 'vllm' needs vLLM: pip install -e '.[vllm]' (or make vllm)"


VLLM_MISSING = vllm_missing()


def vllm_available() -> bool:
    """Whether vLLM can be imported (found without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def make_backend(config: Any, model: Any, tokenizer: Any, *, seed: int = 0) -> PolicyBackend:
    """The backend of ``config`` (a ``ModelConfig``: ``backend``, ``vllm_gpu_memory_utilization``)
    sampling from ``model`` (the trainer's model; the backend gets its weights through
    ``sync_weights`` after every update)."""
    name = getattr(config, "backend", "hf")
    if name == "hf":
        copy = DTYPES["bfloat16"] if getattr(config, "generation_dtype", "auto") == "bfloat16" else None
        return HFPolicy(model, tokenizer, generation_dtype=copy, decode_engine=decode_engine(config, model))
    if name == "vllm":
        if not vllm_available():
            raise ValueError(VLLM_MISSING)
        from tracerl.models.vllm_backend import VLLMPolicy  # optional extra: imported on demand only

        return VLLMPolicy(model, tokenizer, gpu_memory_utilization=config.vllm_gpu_memory_utilization, seed=seed,
                          enable_sleep_mode=bool(getattr(config, "vllm_sleep", False)))
    raise ValueError(f"model.backend = {name!r} is not valid; allowed values: {', '.join(BACKENDS)}")


def decode_engine(config: Any, model: Any) -> str:
    """``model.decode_engine`` resolved for ``model`` (a ``ModelConfig`` without the field: ``auto``).

    ``static`` on a model it cannot run on is refused in one line (``auto`` resolves to ``eager``
    today; were it to resolve to ``static``, it would take ``async`` there, never fail)."""
    name = getattr(config, "decode_engine", "auto")
    engine = resolve_engine(name, precision.model_device(model))
    if engine == "static":
        from tracerl.models.static_decode import static_refusal  # transformers' StaticCache: loaded on demand

        refusal = static_refusal(model)
        if refusal is not None and name == "static":
            raise ValueError(refusal)
        engine = "async" if refusal is not None else engine
    return engine


def make_reference_engine(config: Any, reference_model: Any, tokenizer: Any, *, seed: int = 0) -> Any:
    """A :class:`~tracerl.models.vllm_scoring.VLLMReference` for ``algo.reference_backend = 'vllm'``:
    a vLLM engine of ``reference_model`` (the frozen initial policy; never synced), taking
    ``config.vllm_gpu_memory_utilization`` (``config``: a ``ModelConfig``)."""
    if not vllm_available():
        raise ValueError(vllm_missing("algo.reference_backend"))
    from tracerl.models.vllm_backend import VLLMPolicy  # optional extra: imported on demand only
    from tracerl.models.vllm_scoring import VLLMReference

    policy = VLLMPolicy(reference_model, tokenizer, gpu_memory_utilization=config.vllm_gpu_memory_utilization, seed=seed)
    return VLLMReference(policy)
