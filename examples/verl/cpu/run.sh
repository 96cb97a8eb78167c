#!/usr/bin/env bash
# verl's own trainer with TRACE on the CPU: the tiny model of prepare.py, 2 training steps of 10 leaves
# (verl pads each to 12), a validation before training, a checkpoint every step; two actor ranks (FSDP2 on
# gloo), so two rollout replicas (tensor parallel 1), and the trees expanded on two agent-loop workers.
# Resume by running it again with a higher step count: bash run.sh OUT trainer.total_training_steps=3
#
#   python examples/verl/cpu/prepare.py OUT && bash examples/verl/cpu/run.sh OUT [hydra overrides ...]
#
# What adapts verl to the CPU is tracerl.integrations.verl.cpu (VERL_PLATFORM, VERL_USE_EXTERNAL_MODULES);
# the rollout server is tracerl's HF backend (rollout.name=tracerl_hf). Ray sees two logical GPUs because
# verl's resource pools count GPUs only; CPU-only torch never uses them.
set -euo pipefail
OUT=$(cd "$1" && pwd)
shift
export VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=tracerl.integrations.verl.cpu
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
exec "${PYTHON:-python3}" -m verl.trainer.main_ppo \
  data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/val.parquet" \
  data.train_batch_size=4 data.val_batch_size=4 data.max_prompt_length=256 data.max_response_length=384 \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.model.use_remove_padding=False \
  +actor_rollout_ref.model.override_config.attn_implementation=eager \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.use_torch_compile=False \
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.actor.optim.lr=1e-3 \
  +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32 \
  +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.name=tracerl_hf actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.rollout.n=1 \
  actor_rollout_ref.rollout.temperature=0.7 actor_rollout_ref.rollout.calculate_log_probs=True \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.manager.TraceAgentLoopManager \
  actor_rollout_ref.rollout.agent.num_workers=2 \
  algorithm.adv_estimator=tracerl_trace_credit algorithm.use_kl_in_reward=False \
  reward.reward_model.enable=False reward.num_workers=1 \
  trainer.v1.trainer_mode=tracerl_sync \
  +tracerl.preset=trace +tracerl.config_file="$OUT/tracerl.yaml" +tracerl.readiness=reference_worker +tracerl.check=true \
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
  trainer.device=cpu trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.logger='[console]' \
  trainer.total_training_steps=2 trainer.save_freq=1 trainer.val_before_train=True trainer.test_freq=-1 \
  trainer.default_local_dir="$OUT/ckpt" trainer.resume_mode=auto \
  trainer.project_name=tracerl trainer.experiment_name=cpu hydra.run.dir="$OUT/hydra" \
  ray_kwargs.ray_init.num_cpus=8 +ray_kwargs.ray_init.num_gpus=2 +ray_kwargs.ray_init.include_dashboard=False \
  +ray_kwargs.ray_init.address=local \
  "$@"
