#!/bin/bash
# each arm of experiment=toy_rl_algorithms: its GRPO overrides, 4 steps, from the untrained tiny model and the toy data
# that `recallm-pipeline experiment=toy_rl_algorithms run_dir=/tmp/rltools-toy` wrote (stages model, data)
cd "$(dirname "$0")/../../../.."   # the checkout
T=/tmp/rltools-toy
for arm in grpo dapo gspo one_step_off; do
  case $arm in
    grpo) g="algorithm=grpo rollout=sync";; dapo) g="algorithm=dapo rollout=sync";;
    gspo) g="algorithm=gspo rollout=sync";; one_step_off) g="algorithm=grpo rollout=one_step_off";;
  esac
  echo "=== $arm $(date -u +%T)"
  nice -n 10 .venv/bin/recallm-grpo grpo=tiny_cpu actor_rollout_ref.model.path=$T/model data.train_files=$T/data/train.parquet \
    data.val_files=$T/data/val/reasoning_retrieval.parquet trainer.default_local_dir=/tmp/rltools-cost/grpo/$arm \
    trainer.experiment_name=toy_rl_algorithms-cost-$arm 'trainer.logger=[console,file]' trainer.total_training_steps=4 \
    trainer.save_freq=4 trainer.val_before_train=false data.train_batch_size=8 data.max_prompt_length=400 \
    data.max_response_length=32 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.actor.optim.lr=2.0e-4 \
    actor_rollout_ref.actor.use_kl_loss=false recallm.reward.overlong.enable=false $g
  echo "=== $arm rc=$? $(date -u +%T)"
done
