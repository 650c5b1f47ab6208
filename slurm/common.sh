# Shared by slurm/sft.sbatch, grpo.sbatch and grpo_multinode.sbatch (sourced from the checkout:
# sbatch runs a copy of the script from its spool directory, so it finds this file through
# RECALLM_REPO / the submit directory).
#
# Environment a job reads (all optional):
#   RECALLM_REPO      the checkout (default: the directory sbatch was called from)
#   RECALLM_VENV      its virtual environment (default: $RECALLM_REPO/.venv)
#   RECALLM_DRY_RUN=1 print what would run, run nothing
#   RECALLM_NET_IFACE the network interface between nodes (e.g. ib0, eth1): the Ray head address
#                     is taken from it, and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME default to it
#   RECALLM_HEAD_IP   the head node's address, if you know better than both
#   WANDB_MODE        default offline (compute nodes often have no internet; `wandb sync` the runs
#                     from a login node later); WANDB_DIR default $RECALLM_REPO/outputs/wandb
#
# NCCL between nodes: set NCCL_SOCKET_IFNAME (or RECALLM_NET_IFACE) to the interface the nodes
# reach each other on, NCCL_IB_HCA to the InfiniBand adapters (e.g. mlx5_0,mlx5_1) when there are
# several, and NCCL_DEBUG=INFO to see what NCCL picked. recallm-grpo forwards every NCCL_* and
# GLOO_SOCKET_IFNAME variable (and the W&B ones) to all Ray workers.

recallm_setup() {
  REPO=${RECALLM_REPO:-${SLURM_SUBMIT_DIR:-$(pwd)}}
  VENV=${RECALLM_VENV:-$REPO/.venv}
  cd "$REPO"
  mkdir -p logs
  export WANDB_MODE=${WANDB_MODE:-offline}
  export WANDB_DIR=${WANDB_DIR:-$REPO/outputs/wandb}
  if [[ -n "${RECALLM_NET_IFACE:-}" ]]; then
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$RECALLM_NET_IFACE}
    export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$RECALLM_NET_IFACE}
  fi
  if [[ -n "${SLURM_RESTART_COUNT:-}" && "${SLURM_RESTART_COUNT}" != "0" ]]; then
    echo "[recallm] requeued job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT}): resuming from the newest checkpoint"
  fi
}

# The job's end as seconds since the epoch (SLURM_JOB_END_TIME, else `scontrol show job`); empty
# when unknown (no time limit).
recallm_job_end() {
  if [[ -n "${SLURM_JOB_END_TIME:-}" ]]; then
    echo "$SLURM_JOB_END_TIME"
    return
  fi
  [[ -n "${SLURM_JOB_ID:-}" ]] || return 0
  local end
  end=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^EndTime=//p' | head -n1)
  [[ -n "$end" && "$end" != "Unknown" ]] || return 0
  date -d "$end" +%s 2>/dev/null || true
}

# verl saves a checkpoint, whatever trainer.save_freq says, once the time left before
# MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP is less than a step + a save (60 s) +
# trainer.esi_redundant_time (verl.utils.checkpoint.checkpoint_manager.should_save_ckpt_esi).
# The deadline we give it is the moment SLURM's warning signal arrives (the job's end minus
# $1 seconds, the lead of `#SBATCH --signal`): the checkpoint exists before the job requeues.
recallm_export_deadline() {
  local lead=$1 end
  end=$(recallm_job_end)
  if [[ -n "$end" ]]; then
    export MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP=$((end - lead))
    echo "[recallm] job ends at $end: verl saves before $MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
  else
    echo "[recallm] the job's end time is unknown: checkpoints only every trainer.save_freq steps"
  fi
}

# A block of 200 ports owned by this job (two jobs sharing a node do not collide):
# 20000 + (job id mod 200) * 200 .. +199.
recallm_port_base() {
  echo $((20000 + (${SLURM_JOB_ID:-0} % 200) * 200))
}

# The first address of a node that is not a loopback one (`hostname -I`, or the IPv4 address of
# RECALLM_NET_IFACE). Runs on that node through srun.
recallm_node_ip() {
  local node=$1 ip=""
  if [[ -n "${RECALLM_NET_IFACE:-}" ]]; then
    ip=$(srun --nodes=1 --ntasks=1 --nodelist="$node" ip -o -4 addr show dev "$RECALLM_NET_IFACE" \
      | awk '{print $4}' | cut -d/ -f1 | head -n1)
  else
    ip=$(srun --nodes=1 --ntasks=1 --nodelist="$node" hostname -I | tr ' ' '\n' \
      | grep -v -e '^127\.' -e '^::1$' -e '^$' -e '^fe80:' | head -n1)
  fi
  if [[ -z "$ip" ]]; then
    echo "[recallm] error: no non-loopback address for $node${RECALLM_NET_IFACE:+ on $RECALLM_NET_IFACE}; set RECALLM_HEAD_IP" >&2
    return 1
  fi
  echo "$ip"
}

# Ray's ports for one node, from the job's block (see recallm_port_base). Head only: the GCS,
# dashboard and client ports.
recallm_ray_port_args() {
  local base=$1 role=$2
  local args=(
    "--node-manager-port=$((base + 2))" "--object-manager-port=$((base + 3))"
    "--dashboard-agent-listen-port=$((base + 5))" "--dashboard-agent-grpc-port=$((base + 6))"
    "--metrics-export-port=$((base + 7))" "--runtime-env-agent-port=$((base + 8))"
    "--min-worker-port=$((base + 20))" "--max-worker-port=$((base + 199))"
  )
  if [[ "$role" == head ]]; then
    args=("--port=$base" "--dashboard-port=$((base + 1))" "--ray-client-server-port=$((base + 4))" "${args[@]}")
  fi
  printf '%s\n' "${args[@]}"
}

# Background processes this job started (killed on exit), and the requeue on SLURM's warning.
RECALLM_CHILDREN=()
recallm_cleanup() {
  local pid
  for pid in "${RECALLM_CHILDREN[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
recallm_on_warning() {
  echo "[recallm] warning signal: requeueing job ${SLURM_JOB_ID:-?}; the next run resumes from the newest checkpoint"
  scontrol requeue "${SLURM_JOB_ID}" || echo "[recallm] scontrol requeue failed" >&2
  recallm_cleanup
  exit 0
}

# Run "$@" in the background and wait for it (so that the USR1 trap runs while it works).
recallm_run() {
  "$@" &
  local pid=$!
  RECALLM_CHILDREN+=("$pid")
  wait "$pid"
}
