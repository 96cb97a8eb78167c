"""``tracerl_hf``: tracerl's HF backend as a verl 0.9.1 rollout server (``actor_rollout_ref.rollout.name=tracerl_hf``).

verl's v1 trainer drives rollout servers through three pieces, each provided here:

* :class:`HFServer`, the server actor: verl's server ``generate(prompt_ids, sampling_params,
  request_id)`` answered by tracerl's :class:`~tracerl.models.backend.HFPolicy` (vLLM's parameter
  names: ``max_tokens``, ``temperature``, ``top_p``, ``stop`` with ``include_stop_str_in_output``,
  ``stop_token_ids`` (as the strings those tokens decode to), ``seed``, ``logprobs``), with the
  weights step it holds in ``extra_fields["global_steps"]``.
  Requests that arrive together are sampled as one batch; every row keeps its own seed, so a row's
  tokens do not depend on its batch (the same tokens as ``HFPolicy`` with that seed).
* :class:`HFReplica`, verl's ``RolloutReplica`` (``verl/workers/rollout/replica.py``):
  ``launch_servers`` starts one named :class:`HFServer` per replica.
* :class:`HFServerAdapter`, verl's ``BaseRollout`` in the FSDP worker
  (``verl/workers/rollout/base.py``): ``update_weights`` receives the actor's full tensors after
  each step (verl's checkpoint manager, ``naive`` backend) and loads them into the server with the
  step number.

It runs wherever torch does (verl on the CPU: :mod:`.cpu`) and serves small models: one process,
no paged KV cache, weights copied through Ray's object store each step. The plug-in registers it
(:mod:`.plugin`, without importing this module until a run names it) in verl's ``RolloutReplicaRegistry`` and its adapter table
(``verl.workers.rollout.base._ROLLOUT_REGISTRY``, keyed by ``(name, "async")``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from tracerl.integrations.verl.names import ROLLOUT_NAME
from tracerl.integrations.verl.readiness import prompt_logprobs_fields
from tracerl.models.backend import Generation, HFPolicy, SamplingParams

NAME = ROLLOUT_NAME
"""verl's ``actor_rollout_ref.rollout.name`` of this server."""
SERVER_PREFIX = "tracerl_hf_server_"
"""Ray actor name of replica ``r``'s server: ``SERVER_PREFIX + str(r)`` (the adapter finds it by name)."""


def sampling(sp: dict[str, Any], default_max_tokens: int) -> tuple[SamplingParams, int | None]:
    """tracerl's sampling parameters and the row's seed from vLLM-named ``sp``. Stop strings are
    kept in the output (tracerl trains on them), so ``include_stop_str_in_output`` must not be False."""
    stops = tuple(sp.get("stop") or ())
    if stops and sp.get("include_stop_str_in_output") is False:
        raise ValueError("tracerl_hf keeps stop strings in the output: include_stop_str_in_output must be True")
    if sp.get("top_k", -1) not in (None, -1, 0):
        raise ValueError(f"tracerl_hf samples without top-k; got top_k = {sp['top_k']}")
    params = SamplingParams(max_new_tokens=int(sp.get("max_tokens", default_max_tokens)),
                            temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                            stop_strings=stops)
    seed = sp.get("seed")
    return params, None if seed is None else int(seed)


def _cut(gen: Generation, max_tokens: int) -> Generation:
    """``gen`` as a row asking for ``max_tokens`` would have ended (its text is not read: verl's
    server answers token ids)."""
    if len(gen.token_ids) <= max_tokens:
        return gen
    return Generation(gen.token_ids[:max_tokens], gen.logprobs[:max_tokens], "", "length", gen.state)


class HFServer:
    """One rollout server: an :class:`HFPolicy` over the checkpoint at ``model_path`` (float32)."""

    def __init__(self, model_path: str, response_length: int, threads: int = 1) -> None:
        from tracerl.models.threads import set_threads
        from tracerl.testbed.loading import load_model

        set_threads(threads)
        model, tokenizer = load_model(model_path)
        self.policy = HFPolicy(model.eval(), tokenizer)
        self.response_length = int(response_length)
        self.global_steps: int | None = None
        self._pending: list[tuple[list[int], SamplingParams, int | None, asyncio.Future[Generation]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # sampling and loading weights never overlap

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str | None = None,
                       image_data: Any = None, video_data: Any = None, **_: Any) -> TokenOutput:
        if sampling_params.get("prompt_logprobs") is not None:  # a frozen-reference request (readiness)
            async with self._lock:
                extra = await asyncio.to_thread(prompt_logprobs_fields, self.policy.model, list(prompt_ids),
                                                sampling_params)
            return TokenOutput(token_ids=[0], log_probs=None, stop_reason="completed",
                               extra_fields={"global_steps": self.global_steps, **extra})
        params, seed = sampling(dict(sampling_params), self.response_length)
        stop_ids = sampling_params.get("stop_token_ids") or ()
        if stop_ids:  # vLLM's stop_token_ids (a verl tool parser's), as the strings they decode to
            extra = tuple(self.policy.tokenizer.decode([int(t)]) for t in stop_ids)
            params = dataclasses.replace(params, stop_strings=params.stop_strings + extra)
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), params, seed, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        gen = await future
        return TokenOutput(token_ids=gen.token_ids,
                           log_probs=gen.logprobs if sampling_params.get("logprobs", True) else None,
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    async def _drain(self) -> None:
        """Sample what is pending as batches of equal parameters until nothing is left."""
        await asyncio.sleep(0)  # let the requests sent together arrive first
        while self._pending:
            taken, self._pending = self._pending, []
            # rows that differ only in max_tokens (independent turns ask for each row's own budget)
            # sample as one batch at the largest and are cut to their own: every row has its own seed,
            # so its first tokens are the same whatever it runs beside
            groups: dict[SamplingParams, list[Any]] = {}
            for row in taken:
                groups.setdefault(dataclasses.replace(row[1], max_new_tokens=1), []).append(row)
            async with self._lock:
                for key, rows in groups.items():
                    seeds = [r[2] for r in rows]
                    params = dataclasses.replace(key, max_new_tokens=max(r[1].max_new_tokens for r in rows))
                    try:
                        gens = await asyncio.to_thread(self.policy.generate, [r[0] for r in rows], params,
                                                       None if None in seeds else seeds)
                    except Exception as err:  # each waiting request gets the error
                        for r in rows:
                            r[3].set_exception(err)
                        continue
                    for r, gen in zip(rows, gens, strict=True):
                        r[3].set_result(_cut(gen, r[1].max_new_tokens))

    async def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> int:
        """The actor's weights after step ``global_steps`` (cast to the server's dtype); clears the prefix store."""
        async with self._lock:
            dtype = next(self.policy.model.parameters()).dtype
            self.policy.sync_weights({k: v.to(dtype) for k, v in state.items()}, int(global_steps or 0))
            if global_steps is not None:
                self.global_steps = int(global_steps)
        return len(state)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    # verl's control calls: no device memory to free, no request to abort between steps
    def wake_up(self, tags: Any = None) -> None:
        return None

    def sleep(self) -> None:
        return None

    def clear_kv_cache(self) -> None:
        self.policy.clear_prefix_cache()

    def release_kv_cache(self) -> None:
        return None

    def resume_kv_cache(self) -> None:
        return None

    def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    def resume_generation(self) -> None:
        return None

    def wait_for_requests_to_drain(self) -> None:
        return None

    def start_profile(self, **_: Any) -> None:
        return None

    def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """verl's rollout replica with one :class:`HFServer` (named :data:`SERVER_PREFIX` + rank)."""

    async def launch_servers(self) -> None:
        server = ray.remote(HFServer).options(
            name=f"{SERVER_PREFIX}{self.replica_rank}{self.name_suffix}", num_cpus=0, max_concurrency=self.max_concurrency,
        ).remote(os.path.expanduser(str(self.model_config.path)), self.config.response_length)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{NAME}-{self.replica_rank}"  # a routing name: no HTTP endpoint

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """verl's rollout adapter in the FSDP worker: hands each step's weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1, **_: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        c = self.config
        world = c.tensor_model_parallel_size * c.data_parallel_size * c.pipeline_model_parallel_size
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.leader = rank % world == 0
        self._server: Any = None

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None,
                             wire_format: str = "named_tensors", **_: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"tracerl_hf takes named tensors, got wire_format = {wire_format!r}")
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}  # full tensors
        if self.leader:
            if self._server is None:
                self._server = ray.get_actor(f"{SERVER_PREFIX}{self.replica_rank}")
            await self._server.load_weights.remote(state, global_steps)


def _replica() -> type[RolloutReplica]:
    return HFReplica


def register() -> None:
    """``tracerl_hf`` in verl's replica registry and its table of rollout adapters."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _replica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFServerAdapter"
