# Shared by slurm/sft.sbatch, grpo.sbatch, grpo_multinode.sbatch and eval.sbatch (sourced from the
# checkout: sbatch runs a copy of the script from its spool directory, so it finds this file through
# RECALLM_REPO / the submit directory).
#
# Logs: every script has `#SBATCH --output=slurm/logs/%x-%j.out`. SLURM opens that file, relative to
# the submit directory, before the script starts, so the directory must already exist: slurm/logs/
# is in the checkout (tracked through its .gitignore, which ignores the logs). Submit from the
# checkout's root, or pass your own `sbatch --output=...` (an existing directory).
#
# Environment a job reads (all optional):
#   RECALLM_REPO      the checkout (default: the directory sbatch was called from)
#   RECALLM_VENV      its virtual environment (default: $RECALLM_REPO/.venv)
#   RECALLM_DRY_RUN=1 print what would run, run nothing
#   RECALLM_NGPUS     GPUs per node where SLURM sets no SLURM_GPUS_ON_NODE (default 4; a CPU run: 1)
#   RECALLM_NCPUS     the CPUs each node's Ray declares (grpo*.sbatch; default SLURM_CPUS_PER_TASK; logical,
#                     so a CPU run declares what verl's resource bundles ask for, e.g. 16)
#   RECALLM_PORT_BASE the first of the 200 ports this job's Ray uses (default: from the job id, see
#                     recallm_port_base)
#   RECALLM_NET_IFACE the network interface between nodes (e.g. ib0, eth1): the Ray head address
#                     is taken from it, and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME default to it
#   RECALLM_HEAD_IP   the head node's address, if you know better than both
#   RECALLM_SKIP_PLAN=1 do not run recallm-plan --require-fit before the launch (grpo*.sbatch, sft.sbatch)
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

# A block of 200 ports owned by this job, so that two jobs sharing a node do not collide. The
# blocks tile 10000-65535 outside the node's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
# where the kernel picks the source ports of outgoing connections; 32768-60999 by default): with
# the default range 113 blocks below it (10000-32599) and 22 above (61000-65399), 135 in all. The
# job takes block (job id mod the number of blocks). Residual collision: two jobs on one node whose
# ids differ by a multiple of that number (135 by default) get the same block - set
# RECALLM_PORT_BASE for one of them. Below 10000 live well-known services (and Ray's own defaults,
# 6379 and 8265), hence the floor.
RECALLM_PORT_FLOOR=10000
RECALLM_PORT_BLOCK=200
recallm_port_blocks() {  # the first port of every block, one per line
  local range lo hi p
  range=${RECALLM_EPHEMERAL_RANGE:-$(cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo "32768 60999")}
  read -r lo hi <<< "$range"
  [[ "$lo" =~ ^[0-9]+$ && "$hi" =~ ^[0-9]+$ ]] || { lo=32768; hi=60999; }
  for ((p = RECALLM_PORT_FLOOR; p + RECALLM_PORT_BLOCK - 1 <= 65535; p += RECALLM_PORT_BLOCK)); do
    if ((p + RECALLM_PORT_BLOCK - 1 < lo || p > hi)); then
      echo "$p"
    elif ((p <= hi)); then  # the next block starts right after the ephemeral range
      p=$((hi + 1 - RECALLM_PORT_BLOCK))
    fi
  done
}
recallm_port_base() {
  if [[ -n "${RECALLM_PORT_BASE:-}" ]]; then
    if [[ ! "$RECALLM_PORT_BASE" =~ ^[0-9]+$ ]] || ((RECALLM_PORT_BASE < 1024 || RECALLM_PORT_BASE > 65535 - RECALLM_PORT_BLOCK + 1)); then
      echo "[recallm] error: RECALLM_PORT_BASE=$RECALLM_PORT_BASE is not a port in 1024-$((65535 - RECALLM_PORT_BLOCK + 1))" >&2
      return 1
    fi
    echo "$RECALLM_PORT_BASE"
    return
  fi
  local blocks
  mapfile -t blocks < <(recallm_port_blocks)
  if ((${#blocks[@]} == 0)); then
    echo "[recallm] error: no block of $RECALLM_PORT_BLOCK ports in $RECALLM_PORT_FLOOR-65535 outside the ephemeral range; set RECALLM_PORT_BASE" >&2
    return 1
  fi
  echo "${blocks[$(( ${SLURM_JOB_ID:-0} % ${#blocks[@]} ))]}"
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
# dashboard and client ports. The head and the worker nodes take different ports of the block (the head
# base+0..8 and worker processes base+20..109, a worker node base+12..18 and base+110..199): a head and a
# worker node on one host (two SLURM nodes on one machine: scripts/local_slurm.sh's partition `two`) do
# not collide.
recallm_ray_port_args() {
  local base=$1 role=$2 node=$1 first=$(($1 + 20)) last=$(($1 + 109))
  if [[ "$role" != head ]]; then
    node=$((base + 10)) first=$((base + 110)) last=$((base + 199))
  fi
  local args=(
    "--node-manager-port=$((node + 2))" "--object-manager-port=$((node + 3))"
    "--dashboard-agent-listen-port=$((node + 5))" "--dashboard-agent-grpc-port=$((node + 6))"
    "--metrics-export-port=$((node + 7))" "--runtime-env-agent-port=$((node + 8))"
    "--min-worker-port=$first" "--max-worker-port=$last"
  )
  if [[ "$role" == head ]]; then
    args=("--port=$base" "--dashboard-port=$((base + 1))" "--ray-client-server-port=$((base + 4))" "${args[@]}")
  fi
  printf '%s\n' "${args[@]}"
}

# Start Ray on the job's nodes ("$@": head first) with this job's port block and per-job temp
# directory, and wait until Ray sees every node's GPUs (no fixed sleeps): the head through srun on
# the first node, at its non-loopback address; the script polls until the head is up, starts one
# worker per other node, polls again. Exports RAY_ADDRESS (verl's ray.init joins that cluster).
# Needs BASE, NCPUS, NGPUS, VENV.
recallm_start_ray() {
  local nodes=("$@") head=$1 node ip
  local tmp=/tmp/ray-recallm-${SLURM_JOB_ID:-$$}
  # Ray (>= 2.5x) turns token authentication on in `ray start` when ~/.ray/auth_token exists (any local
  # ray.init() on the node writes one), but never in a process that joins an explicit address (the poll
  # below, the driver): refused as "InvalidAuthToken" (seen under a real SLURM). One mode and one token for
  # the whole job, in the environment srun gives every node (RAY_AUTH_MODE=disabled turns it off).
  if [[ "${RAY_AUTH_MODE:-}" != disabled ]]; then
    export RAY_AUTH_MODE=token
    RAY_AUTH_TOKEN=${RAY_AUTH_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
    export RAY_AUTH_TOKEN
  fi
  ip=${RECALLM_HEAD_IP:-$(recallm_node_ip "$head")} || return 1
  export RAY_ADDRESS="$ip:$BASE"
  echo "[recallm] Ray head $head ($RAY_ADDRESS), ${#nodes[@]} node(s) x $NGPUS GPU(s), ports $BASE-$((BASE + RECALLM_PORT_BLOCK - 1))"
  local head_ports worker_ports
  mapfile -t head_ports < <(recallm_ray_port_args "$BASE" head)
  srun --nodes=1 --ntasks=1 --nodelist="$head" "$VENV/bin/ray" start --head --node-ip-address="$ip" \
    "${head_ports[@]}" --num-cpus="$NCPUS" --num-gpus="$NGPUS" --temp-dir="$tmp" --block &
  RECALLM_CHILDREN+=("$!")
  "$VENV/bin/python" -m recallm.grpo.cluster --address "$RAY_ADDRESS" --nodes 1 --gpus "$NGPUS" \
    --timeout "${RECALLM_RAY_TIMEOUT:-600}" || return 1
  if ((${#nodes[@]} > 1)); then
    mapfile -t worker_ports < <(recallm_ray_port_args "$BASE" worker)
    for node in "${nodes[@]:1}"; do
      # (a temp directory per node: two nodes on one host would otherwise share one session's logs, and
      # every raylet's log monitor would print each worker's output again)
      srun --nodes=1 --ntasks=1 --nodelist="$node" "$VENV/bin/ray" start --address="$RAY_ADDRESS" \
        "${worker_ports[@]}" --num-cpus="$NCPUS" --num-gpus="$NGPUS" --temp-dir="$tmp-$node" --block &
      RECALLM_CHILDREN+=("$!")
    done
    "$VENV/bin/python" -m recallm.grpo.cluster --address "$RAY_ADDRESS" --nodes "${#nodes[@]}" \
      --gpus "$((${#nodes[@]} * NGPUS))" --timeout "${RECALLM_RAY_TIMEOUT:-600}" || return 1
  fi
}

# Background processes this job started (killed on exit), and the requeue on SLURM's warning.
# The cleanup sends SIGTERM to the given PIDs (default: all of them), waits up to RECALLM_CLEANUP_WAIT
# seconds (default 30) for them to end, then SIGKILLs what is left: the job does not end while its
# children still run.
RECALLM_CHILDREN=()
recallm_cleanup() {
  local pid left i pids=("$@")
  ((${#pids[@]})) || pids=("${RECALLM_CHILDREN[@]}")
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for ((i = 0; i < ${RECALLM_CLEANUP_WAIT:-30} * 10; i++)); do
    left=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null && left=1
    done
    ((left)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
  done
}
# The run first (SIGTERM: recallm-sft and recallm-grpo end their step and save a checkpoint, recallm-eval has
# written every finished example; up to RECALLM_SAVE_WAIT seconds, default 120, the GRPO scripts' the signal's
# lead less a minute), and only then what serves it (Ray's nodes, a judge server: GRPO's save needs its Ray
# cluster up until it ends), then the requeue: `scontrol requeue` kills what is left of the job after
# KillWait (often 30 s), too short a grace for a save.
recallm_on_warning() {
  echo "[recallm] warning signal: stopping the run (it saves first), then requeueing job ${SLURM_JOB_ID:-?}; the next run resumes from the newest checkpoint"
  if [[ -n "${RECALLM_RUN_PID:-}" ]]; then
    RECALLM_CLEANUP_WAIT=${RECALLM_SAVE_WAIT:-120} recallm_cleanup "$RECALLM_RUN_PID"
  fi
  recallm_cleanup
  scontrol requeue "${SLURM_JOB_ID}" || echo "[recallm] scontrol requeue failed" >&2
  exit 0
}

# The plan of the run (recallm-plan --require-fit: GPU memory, host RAM, disk at the checkpoint
# directory, one save's time against the deadline verl is given), on the node before anything starts:
# a run that would not fit stops here with one line saying what and which key to change.
# RECALLM_SKIP_PLAN=1 skips it.
recallm_plan() {
  [[ "${RECALLM_SKIP_PLAN:-0}" == "1" ]] && return 0
  "$VENV/bin/recallm-plan" "$@" --require-fit
}

# Run "$@" in the background and wait for it (so that the USR1 trap runs while it works).
recallm_run() {
  "$@" &
  RECALLM_RUN_PID=$!
  RECALLM_CHILDREN+=("$RECALLM_RUN_PID")
  wait "$RECALLM_RUN_PID"
}
