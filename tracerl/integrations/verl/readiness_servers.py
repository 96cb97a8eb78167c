"""Frozen-reference servers for ``+tracerl.readiness=reference_server``, started by the ``tracerl_sync`` trainer.

Why not verl's own teacher servers as configured: verl 0.9.1 starts them only with
``distillation.enabled=true`` (``need_teacher_policy``), and then every actor worker trains on
``distillation_ppo_loss``, which reads ``teacher_logprobs`` for every sample (verl's agent-loop
workers write them; TRACE's manager does not) and adds ``distillation_loss_coef`` times that loss.
The servers themselves are what readiness needs: ``TeacherModelManager`` (verl's
``experimental/teacher_loop``) starts replicas of the rollout server class on GPUs of their own
(``is_teacher_model=True``), loaded from a model path and outside the checkpoint manager's replica
list, so verl never syncs, sleeps or wakes them: they keep the initial weights for the whole run.
:func:`start_reference_servers` starts such a manager on the actor's initial checkpoint
(``actor_rollout_ref.model.path``) on a resource pool of its own, and the trainer returns its
client from ``get_teacher_client``, which ``main_ppo`` hands to the manager as
``teacher_client[SERVER_KEY]``.

Settings (``+tracerl.reference_server.*``): ``num_replicas`` (1), ``tensor_model_parallel_size``
(1), ``gpu_memory_utilization`` (0.5), ``n_gpus_per_node`` (the replicas' GPUs, at most
``trainer.n_gpus_per_node``). The servers take everything else from ``actor_rollout_ref.rollout``
(the engine, its dtype, prefix caching), load the checkpoint itself (``load_format=auto``: the
policy's servers load ``dummy`` weights that the actor's sync replaces), and have room for the
policy's prompt plus response plus :data:`ANSWER_ROOM` (a node row is a prefix, the opener and the
gold) and one generated token.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

from tracerl.errors import UserError
from tracerl.integrations.verl.readiness import SERVER_KEY

ANSWER_ROOM = 256
"""Tokens a readiness row may hold past the policy's prompt and response (opener and gold answer)."""
POOL = "tracerl_reference_pool"
"""Ray resource pool of the frozen-reference servers."""


@dataclass(frozen=True)
class ServerSettings:
    """``+tracerl.reference_server``: replicas, their tensor parallelism and GPU layout."""

    num_replicas: int = 1
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    n_gpus_per_node: int = 1
    nnodes: int = 1


def server_settings(config: Any) -> ServerSettings:
    """:class:`ServerSettings` from verl's whole ``config``, refused in one line when they cannot hold."""
    section = (config.get("tracerl", None) or {}).get("reference_server", None) or {}
    replicas, tp = int(section.get("num_replicas", 1)), int(section.get("tensor_model_parallel_size", 1))
    util = float(section.get("gpu_memory_utilization", 0.5))
    if replicas < 1 or tp < 1 or not 0.0 < util <= 1.0:
        raise UserError(f"tracerl.reference_server: num_replicas = {replicas} and tensor_model_parallel_size = {tp} "
                        f"must be >= 1 and gpu_memory_utilization = {util:g} in (0, 1]")
    total = replicas * tp
    per_node = int(section.get("n_gpus_per_node", min(total, int(config.trainer.get("n_gpus_per_node", 1)))))
    if per_node < 1 or total % per_node:
        raise UserError(f"tracerl.reference_server.n_gpus_per_node = {per_node}: the servers' {total} GPUs "
                        f"(num_replicas {replicas} x tensor_model_parallel_size {tp}) must fill whole nodes of it")
    return ServerSettings(replicas, tp, util, per_node, total // per_node)


def reference_inference(config: Any, settings: ServerSettings) -> Any:
    """The servers' ``RolloutConfig`` (as a DictConfig): the policy's rollout settings, the servers' own
    parallelism and memory, room for a whole trajectory plus an answer, one generated token."""
    from omegaconf import OmegaConf

    rollout = OmegaConf.to_container(config.actor_rollout_ref.rollout, resolve=True)
    assert isinstance(rollout, dict)
    for key in ("agent", "val_kwargs", "checkpoint_engine"):
        rollout.pop(key, None)  # the policy's agent loop, validation and weight-sync settings
    room = int(rollout.get("prompt_length", 512)) + int(rollout.get("response_length", 512)) + ANSWER_ROOM
    longest = rollout.get("max_model_len")
    # the policy's servers load "dummy" weights that the actor's sync replaces; these load the checkpoint
    rollout.update(tensor_model_parallel_size=settings.tensor_model_parallel_size, data_parallel_size=1,
                   pipeline_model_parallel_size=1, gpu_memory_utilization=settings.gpu_memory_utilization,
                   prompt_length=room, response_length=1, n=1, load_format="auto",
                   max_model_len=None if longest is None else int(longest) + ANSWER_ROOM)
    return OmegaConf.create(rollout)


def check_room(settings: ServerSettings, config: Any) -> None:
    """Refuse in one line when Ray lacks the servers' GPUs or CPUs right now: verl would wait for
    their placement group without end (one CPU and one GPU a server GPU, ``max_colocate_count=1``)."""
    import ray

    from verl.utils.device import get_resource_name

    need = settings.n_gpus_per_node * settings.nnodes
    free = ray.available_resources()
    gpu = get_resource_name()
    have = {gpu: float(free.get(gpu, 0.0)), "CPU": float(free.get("CPU", 0.0))}
    if have[gpu] < need or have["CPU"] < need:
        raise UserError(f"+tracerl.readiness=reference_server: the frozen-reference servers need {need} free {gpu} and "
                        f"{need} free CPU in Ray besides the trainer's pools, and Ray has {have[gpu]:g} and "
                        f"{have['CPU']:g} left; add them (ray_kwargs.ray_init.num_gpus / num_cpus, or a node) or lower "
                        "tracerl.reference_server.num_replicas")


class ReferenceServers:
    """The frozen-reference replicas (verl's ``TeacherModelManager``) and their client."""

    def __init__(self, config: Any) -> None:
        from verl.experimental.teacher_loop.teacher_model import TeacherModelManager
        from verl.single_controller.ray import ResourcePoolManager
        from omegaconf import OmegaConf
        from verl.utils.config import omega_conf_to_dataclass

        self.config = config
        self.settings = s = server_settings(config)
        check_room(s, config)
        pools = ResourcePoolManager(resource_pool_spec={POOL: [s.n_gpus_per_node] * s.nnodes}, mapping={},
                                    max_colocate_count=1)
        pools.create_resource_pool()
        teacher = omega_conf_to_dataclass(OmegaConf.create(
            {"_target_": "verl.workers.config.DistillationTeacherModelConfig", "key": SERVER_KEY,
             "model_path": str(config.actor_rollout_ref.model.path), "num_replicas": s.num_replicas,
             "inference": reference_inference(config, s)}))
        # TeacherModelManager reads only n_gpus_per_node of verl's distillation config
        self.manager = TeacherModelManager(types.SimpleNamespace(n_gpus_per_node=s.n_gpus_per_node), teacher,
                                           pools.resource_pool_dict[POOL])

    def client(self) -> dict[str, Any]:
        """``{SERVER_KEY: LLMServerClient}`` over the replicas' router, as verl's ``get_teacher_client``."""
        from verl.workers.rollout.llm_server import LLMServerClient

        return {SERVER_KEY: LLMServerClient(config=self.config, load_balancer_handle=self.manager.load_balancer_handle)}


def wants_servers(config: Any) -> bool:
    """Whether ``config`` asks for readiness on frozen-reference servers."""
    return str((config.get("tracerl", None) or {}).get("readiness", "in_process")) == "reference_server"
