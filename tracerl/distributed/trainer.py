"""The Trainer over several processes: rank 0 drives, ranks > 0 serve the sharded update.

Rank 0 runs the whole :class:`~tracerl.train.loop.Trainer` (scheme, executor, advantages,
predictor, logs, run lock) on an unsharded copy of the policy that its rollout backend samples
from. Every rank, rank 0 included, holds a :class:`ShardedPolicy`: the FSDP2-sharded policy, its
AdamW over the shards and the sharded frozen reference (when the KL term is on). Per update,
rank 0 broadcasts a command, plans the step (:func:`~tracerl.distributed.update.plan_update`)
and scatters each rank its share; after the update the full weights are gathered back into
rank 0's copy (what its backend samples next and what ``policy/`` checkpoints hold). With Ray
rollout workers rank 0 keeps no such copy: the workers and ``policy/`` get the weights streamed
from the shards (:mod:`~tracerl.distributed.streamed`, command ``export``).

Commands (through the rendezvous store, :mod:`tracerl.distributed.commands`): ``run`` (the run
folder), ``update`` (then a scatter of shares), ``save``/``load`` a DCP folder, ``stream``
and ``export`` (the weights streamed to Ray workers or into ``policy/``), ``stop``. Between
commands the other ranks wait on the store while rank 0 beats, so rank 0's own phases (sampling,
scoring, evaluation, checkpoints) never count against ``dist.timeout_s``; the collectives after a
command do. The other ranks do nothing else, so they never touch the run folder except
``initial/`` (read) and the checkpoint's ``dcp/`` (their shards).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tracerl.core.types import Trajectory
from tracerl.models.lora import trainable_parameters
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.config.loading import ConfigError
from tracerl.runs.sharded import load_sharded, save_sharded
from tracerl.distributed.update import UpdateShare, plan_update, sharded_policy_update, sharded_trainer_logprobs
from tracerl.distributed.launch import launched_world
from tracerl.distributed.commands import CommandChannel, rendezvous_store
from tracerl.distributed.fsdp import full_state_dict, init_distributed, scatter_shares
from tracerl.distributed.shard_load import build_sharded, whole_load_reason
from tracerl.distributed.streamed import ShardStream, StreamedPolicy, drain
from tracerl.runs.initial import initial_source
from tracerl.runs.state import INITIAL
from tracerl.train.loop import prepare_policy
from tracerl.train.update import UpdateSettings, update_settings

COUNT_KEYS = ("trained_tokens", "update_forward_tokens", "unique_trained_tokens", "nonfinite_skipped",
               "scaler_skipped")


class ShardedPolicy:
    """One rank's shard of the policy, its optimiser and the sharded reference.

    Both are built on the meta device and read only this rank's rows from ``folder``, the run's
    initial policy (:mod:`~tracerl.distributed.shard_load`): no rank, rank 0 included, holds a
    whole copy to shard (unless the folder's weights must be converted while loading: then each
    rank loads them whole, and a warning says so). The reference is the initial policy, so it is read from there also on
    resume (the policy's shards then come from the checkpoint's DCP folder).
    """

    def __init__(self, config: TrainConfig, folder: Path, pad_id: int, mesh: Any) -> None:
        self.config, self.pad_id, self.mesh = config, pad_id, mesh
        self.settings: UpdateSettings = update_settings(config)
        dtype = config.dist.fsdp_dtype(config.model.dtype)
        device = config.model.device
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.with_kl = config.optim.kl_coef > 0
        self.reference = None
        reason = whole_load_reason(folder)  # None: each rank reads its rows (else a warning says why not)
        if self.with_kl:
            self.reference = build_sharded(folder, mesh, dtype, device, reason=reason).requires_grad_(False)
        self.model = build_sharded(folder, mesh, dtype, device, lambda m: prepare_policy(m, config), reason)
        o = config.optim
        self.optimizer = torch.optim.AdamW(trainable_parameters(self.model), lr=o.lr, betas=o.betas,
                                           weight_decay=o.weight_decay)

    def run_update(self, message: dict[str, Any]) -> dict[str, float]:
        """This rank's optimiser steps of one RL step (``message``: lr, recompute flag, shares)."""
        for group in self.optimizer.param_groups:
            group["lr"] = message["lr"]
        shares: list[UpdateShare] = message["shares"]
        merged: dict[str, float] = {}
        if message["recompute"]:
            shares, merged = sharded_trainer_logprobs(self.model, shares, self.settings, self.pad_id)
        for share in shares:
            metrics = sharded_policy_update(self.model, self.optimizer, share, self.settings, self.pad_id,
                                            self.reference)
            for key, value in metrics.items():  # as Trainer._update merges updates_per_step
                merged[key] = merged.get(key, 0.0) + (value if key in COUNT_KEYS else value / len(shares))
        return merged


def start_driver(trainer: Any) -> Driver | None:
    """Rank 0's hook in ``Trainer._build`` (after the optimiser is built; ``tracerl train --nproc N``
    hands it to the Trainer as ``start_driver``): join the process group,
    tell the other ranks the run folder, shard, and put the sharded optimiser in the Trainer.
    None when ``dist.nproc`` is 1 (nothing changes)."""
    cfg = trainer.config
    if cfg.dist.nproc == 1:
        return None
    if launched_world() != cfg.dist.nproc:
        raise ConfigError(f"dist.nproc = {cfg.dist.nproc} but this process was started as one of "
                          f"{launched_world()}; use `tracerl train ... --nproc {cfg.dist.nproc}` or torchrun "
                          f"--nproc_per_node {cfg.dist.nproc}")
    folder = Path(initial_source(trainer.run_dir / INITIAL))
    store, rank, _ = rendezvous_store(cfg.dist.timeout_s)
    channel = CommandChannel(store, rank, cfg.dist.timeout_s)
    channel.start_heartbeat()
    channel.send("run", str(trainer.run_dir))  # the others load initial/ from it (written by now), then join
    mesh = init_distributed(cfg.dist.backend, cfg.model.device, cfg.dist.timeout_s, store)
    sharded = ShardedPolicy(cfg, folder, trainer.tokenizer.pad_token_id, mesh)
    trainer.optimizer = sharded.optimizer
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(sharded.optimizer, trainer.scheduler.lr_lambdas[0])
    return Driver(sharded, trainer.model, channel, streamed=streams_weights(cfg))


def streams_weights(config: TrainConfig) -> bool:
    """Whether rank 0 keeps no unsharded policy: with Ray rollout workers it samples nothing, so the
    workers and ``policy/`` get the weights streamed from the shards (:mod:`~tracerl.distributed.streamed`)."""
    return config.dist.nproc > 1 and config.rollout.executor == "ray"


class Driver:
    """Rank 0's side of the commands, used by the Trainer's hooks.

    ``streamed`` (:func:`streams_weights`): the Trainer's unsharded ``rollout_model`` is released
    (moved to the meta device) and never gathered into; :meth:`weights` and :meth:`policy` stream
    from the shards instead."""

    def __init__(self, sharded: ShardedPolicy, rollout_model: Any, channel: CommandChannel,
                 streamed: bool = False) -> None:
        self.sharded, self.rollout_model, self.channel = sharded, rollout_model, channel
        self.streamed = streamed
        if streamed:
            rollout_model.to("meta")  # its storage is freed; the shards are the policy from here on
            _return_freed_memory()

    def weights(self) -> Any:
        """What the executor's ``sync_weights`` takes: the shards' stream, or the gathered copy."""
        return ShardStream(self.sharded.model, self.channel) if self.streamed else self.rollout_model

    def policy(self) -> Any:
        """What a checkpoint's ``policy/`` is written from (``save_pretrained``)."""
        if self.streamed:
            return StreamedPolicy(self.sharded.model, self.rollout_model.config, self.channel)
        return self.rollout_model

    def update(self, pairs: list[tuple[Trajectory, torch.Tensor]], updates_per_step: int, recompute: bool,
               scheduler: Any) -> dict[str, float]:
        """``Trainer._update`` over all ranks: plan, scatter, update, gather; then the schedule steps."""
        s = self.sharded
        chunks = np.array_split(np.arange(len(pairs)), min(updates_per_step, len(pairs)))
        steps = [plan_update([pairs[i][0] for i in c], [pairs[i][1] for i in c], s.settings, s.with_kl, s.world)
                 for c in chunks]
        lr = s.optimizer.param_groups[0]["lr"]
        messages = [{"lr": lr, "recompute": recompute, "shares": [step[rank] for step in steps]}
                    for rank in range(s.world)]
        self.channel.send("update")  # planned first: the others wait in the scatter only while it travels
        metrics = s.run_update(scatter_shares(messages))
        if not self.streamed:  # streamed: the executor's sync gathers them, bucket by bucket
            self.pull_weights()
        with warnings.catch_warnings():  # the schedule follows RL steps, also those whose update was skipped
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            scheduler.step()
        return metrics

    def pull_weights(self) -> None:
        """Gather the shards into rank 0's unsharded copy (all ranks take part)."""
        full = full_state_dict(self.sharded.model)
        load_full_state(self.rollout_model, full)

    def save(self, folder: Path) -> None:
        self.channel.send("save", str(folder))
        save_sharded(folder, self.sharded.model, self.sharded.optimizer)

    def load(self, folder: Path) -> None:
        self.channel.send("load", str(folder))
        load_sharded(folder, self.sharded.model, self.sharded.optimizer)
        if not self.streamed:
            self.pull_weights()

    def close(self) -> None:
        if dist.is_initialized():
            self.channel.send("stop")
            dist.destroy_process_group()
        self.channel.stop_heartbeat()


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``): the released policy
    was loaded in many allocations below glibc's mmap threshold, which ``free`` keeps in the heap."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):  # glibc only; elsewhere the pages stay
        libc.malloc_trim(0)


def load_full_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load a gathered full state dict; only tied weights (one tensor, two names) may be absent."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if getattr(model.config, "tie_word_embeddings", False)
            and name.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"gathered weights do not fit the policy: missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")


def serve(config: TrainConfig) -> None:
    """A rank > 0: join, load the initial policy rank 0 wrote, then run commands until ``stop``."""
    from transformers import AutoTokenizer

    from tracerl.models.threads import set_threads

    set_threads(config.model.threads, config.model.device)
    store, rank, _ = rendezvous_store(config.dist.timeout_s)
    channel = CommandChannel(store, rank, config.dist.timeout_s)
    kind, arg = channel.receive()  # rank 0 sends the run folder once its Trainer is built (no limit before)
    if kind != "run":
        raise RuntimeError(f"rank {rank}: the first command from rank 0 is {kind!r}, not 'run'")
    mesh = init_distributed(config.dist.backend, config.model.device, config.dist.timeout_s, store)
    run_dir = Path(arg)
    folder = Path(initial_source(run_dir / INITIAL))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))  # for the pad id, as load_model sets it
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sharded = ShardedPolicy(config, folder, pad_id, mesh)
    streamed = streams_weights(config)

    def gather() -> None:
        if not streamed:  # streamed: rank 0 announces each stream (``stream``) when the workers take it
            full_state_dict(sharded.model)
    try:
        while True:
            kind, arg = channel.receive()  # rank 0's own phases: waited for while it beats
            if kind == "update":
                sharded.run_update(scatter_shares(None))
                gather()  # rank 0 gathers the new weights into its copy
            elif kind == "save":
                save_sharded(Path(arg), sharded.model, sharded.optimizer)
            elif kind in ("stream", "export"):  # no copy on rank 0: to the rollout workers, or policy/
                drain(sharded.model)
            elif kind == "load":
                load_sharded(Path(arg), sharded.model, sharded.optimizer)
                gather()
            elif kind == "stop":
                break
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.destroy_process_group()


def serve_rank(preset: str | None, config_file: str | None, overrides: list[str], smoke: bool | str,
               resume: str | None, nproc: int | None, *, trust_code: bool = False) -> None:
    """A rank > 0: the same config rank 0 resolves (for the process group's settings), then serve."""
    from tracerl.train.run import resumed_config

    config: TrainConfig
    if resume:  # rank 0's rule (config/resume_rule.py), so every rank holds the same config
        config, _ = resumed_config(Path(resume), preset=preset, config_file=config_file, overrides=overrides,
                                   trust_code=trust_code)
        if nproc is not None:
            config.dist.nproc = nproc
    else:
        config = resolve_config(preset or "", config_file=config_file, overrides=overrides, smoke=smoke)
    serve(config)
