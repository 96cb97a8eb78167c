#!/usr/bin/env bash
# TRACE inside verl 0.9.1: Qwen3-4B on Search-R1-style data, one node with 8 GPUs.
# NOT run by the project (no GPU machine with vLLM here): this is the command a GPU user runs.
#
# Before: pip install -e '.[verl]' plus verl's GPU stack (vllm, flash-attn) on the GPU machine;
#   verl's examples/data_preprocess/preprocess_search_r1_dataset.py (from a verl 0.9.1 checkout)
#   -> $DATA/train.parquet, $DATA/test.parquet (prompt, reward_model.ground_truth.target, extra_info);
#   tracerl data convert ... -> $CORPUS/{tasks,corpus}.jsonl (the corpus the search tool reads;
#   the parquet's questions are what the manager trains on).
# MODEL is the one model path: verl's actor and tracerl's tokenizer and frozen reference both take it
# (the manager refuses a tracerl config that names another checkpoint). Paths are made absolute here:
# verl's TaskRunner, where the manager runs, may start on another node and in another directory.
# No KL term: readiness scores on verl's reference worker (+tracerl.readiness=reference_worker), which
# the tracerl_sync trainer has verl build without a reference forward over every leaf.
# trainer.default_local_dir must be a path every node sees: verl resumes only from there.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-4B}
DATA=$(realpath "${DATA:-$HOME/data/searchR1}")
CORPUS=$(realpath "${CORPUS:-data/search_r1}")
HERE=$(cd "$(dirname "$0")" && pwd)

python3 -m verl.trainer.main_ppo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=64 \
  data.val_batch_size=64 \
  data.max_prompt_length=1024 \
  data.max_response_length=3072 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=1 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.val_kwargs.n=1 \
  actor_rollout_ref.rollout.val_kwargs.temperature=0.0 \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class=tracerl.integrations.verl.manager.TraceAgentLoopManager \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  algorithm.adv_estimator=tracerl_trace_credit \
  algorithm.use_kl_in_reward=False \
  +algorithm.tracerl.w_turn=0.2 \
  reward.reward_model.enable=False \
  trainer.v1.trainer_mode=tracerl_sync \
  +tracerl.preset=trace \
  +tracerl.readiness=reference_worker \
  +tracerl.config_file="$HERE/qwen3_4b_search_r1.yaml" \
  "+tracerl.overrides=['data.tasks=$CORPUS/tasks.jsonl','data.corpus=$CORPUS/corpus.jsonl']" \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.save_freq=20 \
  trainer.test_freq=20 \
  trainer.total_epochs=1 \
  trainer.logger='[console]' \
  "$@"
