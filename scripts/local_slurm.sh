#!/usr/bin/env bash
# A real one-machine SLURM cluster (Debian's slurm-wlm and munge): two nodes on this machine (two slurmd,
# each declaring this machine's CPUs and memory, on their own ports), the default partition `debug` with
# the first node alone and the partition `two` with both (`sbatch -p two --nodes=2` for a two-node job),
# requeue allowed, everything under one scratch directory. For a person trying the sbatch scripts, and
# for the cluster test tier (tests/cluster, `make test-cluster`).
#
#   bash scripts/local_slurm.sh start DIR   # install what is missing, write DIR/slurm.conf, start munged,
#                                           # slurmctld and slurmd, wait until sinfo shows the node idle
#   export SLURM_CONF=DIR/slurm.conf        # then: sbatch, squeue, scontrol, scancel, srun as usual
#   bash scripts/local_slurm.sh stop DIR    # cancel what still runs, stop the three daemons (their PIDs)
#   bash scripts/local_slurm.sh install     # only install slurm-wlm and munge
#
# Needs root (slurmd runs jobs as their user, and munged's key is root's here) and, when the packages
# are missing, apt-get. Where it cannot run it prints `skip: <reason>` and exits 77 (the tests skip
# with that reason); an error exits 1. Nothing is started through systemd, nothing outside DIR is
# written but the packages. Environment (all optional):
#   LOCAL_SLURM_CTLD_PORT, LOCAL_SLURM_SLURMD_PORT  default 16817 and 16818 (the second slurmd: the next
#                                                   port; not SLURM's own 6817/6818, so that a system
#                                                   SLURM is left alone)
#   LOCAL_SLURM_TIMEOUT  seconds to wait for the nodes to be idle (default 60)
#
# sacct needs slurmdbd and a database, which this does not set up: the final state of every job is in
# DIR/jobcomp.log (JobCompType=jobcomp/filetxt: one line per run of a job, requeues included), and
# `scontrol show job` keeps finished jobs for an hour (MinJobAge).
set -uo pipefail

SKIP=77
skip() { echo "skip: $*" >&2; exit "$SKIP"; }
die() { echo "error: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
    || missing+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  ((${#missing[@]} == 0)) && return 0
  [[ "$(id -u)" == 0 ]] || skip "SLURM is not installed (${missing[*]}) and installing it needs root"
  command -v apt-get >/dev/null 2>&1 || skip "SLURM is not installed (${missing[*]}) and there is no apt-get"
  echo "local_slurm: apt-get install ${missing[*]}"
  # `apt-get update` first only when the package is unknown (a fresh image has no lists)
  if ! apt-cache show slurm-wlm >/dev/null 2>&1; then
    timeout 300 apt-get update -qq >/dev/null || skip "apt-get update failed"
  fi
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}" >/dev/null \
    || skip "apt-get install ${missing[*]} failed"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Wait until $1 (a command) succeeds, at most $2 seconds
wait_for() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do
    eval "$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

write_conf() {
  local dir=$1 host=$2 ctld_port=$3 slurmd_port=$4 node cpus mem
  # The node as slurmd sees it (CPUs, sockets, cores, threads, memory); RealMemory a little below what it
  # measures, or slurmd reports less than configured and the node is drained.
  node=$(slurmd -C 2>/dev/null | head -n1) || die "slurmd -C failed"
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
  [[ -n "$cpus" && -n "$mem" ]] || die "cannot read CPUs and RealMemory from 'slurmd -C': $node"
  node=${node/NodeName=* CPUs=/CPUs=}
  node=${node/RealMemory=$mem/RealMemory=$((mem * 9 / 10))}
  cat >"$dir/slurm.conf" <<EOF
# written by scripts/local_slurm.sh: two nodes on this machine, two partitions, everything under $dir
ClusterName=local
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd-%n.pidfile
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# requeue allowed (sbatch --requeue, scontrol requeue); a killed step gets SIGKILL 5 s after SIGTERM
JobRequeue=1
KillWait=5
ReturnToService=2
MinJobAge=3600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeHostname=$host Port=$slurmd_port $node State=UNKNOWN
NodeName=$host-2 NodeHostname=$host NodeAddr=$host Port=$((slurmd_port + 1)) $node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=two Nodes=$host,$host-2 MaxTime=INFINITE State=UP
EOF
}

start() {
  local dir=$1 host ctld_port slurmd_port pid
  [[ "$(id -u)" == 0 ]] || skip "a local SLURM needs root (slurmd starts jobs as their user)"
  install_packages
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  if [[ -f "$dir/slurmctld.pid" ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    die "a local SLURM already runs from $dir (stop it first: $0 stop $dir)"
  fi
  host=$(hostname -s)
  ctld_port=${LOCAL_SLURM_CTLD_PORT:-16817}
  slurmd_port=${LOCAL_SLURM_SLURMD_PORT:-16818}
  port_free "$ctld_port" || skip "port $ctld_port (slurmctld) is taken: set LOCAL_SLURM_CTLD_PORT"
  port_free "$slurmd_port" || skip "port $slurmd_port (slurmd) is taken: set LOCAL_SLURM_SLURMD_PORT"
  port_free "$((slurmd_port + 1))" || skip "port $((slurmd_port + 1)) (the second slurmd) is taken: set LOCAL_SLURM_SLURMD_PORT"
  mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/munge"
  chmod 700 "$dir/munge"
  write_conf "$dir" "$host" "$ctld_port" "$slurmd_port"
  export SLURM_CONF=$dir/slurm.conf

  # munged: its own key, socket, PID, log and seed files under DIR (a system munged is left alone)
  if [[ ! -f "$dir/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none || die "cannot write the munge key"
    chmod 400 "$dir/munge/munge.key"
  fi
  munged --force --foreground --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pidfile" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" \
    </dev/null >>"$dir/log/munged.out" 2>&1 &
  echo $! >"$dir/munged.pid"
  wait_for "[[ -S '$dir/munge/munge.socket' ]]" 15 || { stop "$dir"; die "munged did not start (see $dir/log/munged.out)"; }

  setsid slurmctld -D -i -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmctld.out" 2>&1 &
  echo $! >"$dir/slurmctld.pid"
  wait_for "scontrol ping | grep -q UP" 30 || { stop "$dir"; die "slurmctld did not answer (see $dir/log/slurmctld.log)"; }
  mkdir -p "$dir/spool/$host" "$dir/spool/$host-2"
  setsid slurmd -D -N "$host" -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmd.out" 2>&1 &
  echo $! >"$dir/slurmd.pid"
  setsid slurmd -D -N "$host-2" -f "$SLURM_CONF" </dev/null >>"$dir/log/slurmd-2.out" 2>&1 &
  echo $! >"$dir/slurmd2.pid"
  if ! wait_for "[[ \$(sinfo -h -p two -o %T) == idle ]]" "${LOCAL_SLURM_TIMEOUT:-60}"; then
    local state
    state=$(sinfo -h -N -p two -o '%N %T %E' 2>&1 | tr '\n' ' ')
    stop "$dir"
    die "the nodes $host and $host-2 are not idle after ${LOCAL_SLURM_TIMEOUT:-60} s ($state; see $dir/log/slurmd-*.log)"
  fi
  for pid in munged slurmctld slurmd slurmd2; do
    kill -0 "$(cat "$dir/$pid.pid")" 2>/dev/null || { stop "$dir"; die "$pid exited (see $dir/log)"; }
  done
  echo "local_slurm: nodes $host (partition debug, the default) and $host-2 (with $host: partition two) idle (SLURM_CONF=$dir/slurm.conf)"
}

# Stop a daemon by the PID recorded in DIR/NAME.pid: SIGTERM, up to 15 s, then SIGKILL
stop_one() {
  local dir=$1 name=$2 pid i
  [[ -f "$dir/$name.pid" ]] || return 0
  pid=$(cat "$dir/$name.pid")
  if kill "$pid" 2>/dev/null; then
    for ((i = 0; i < 75; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null && echo "local_slurm: $name ($pid) killed after 15 s"
  fi
  rm -f "$dir/$name.pid"
}

stop() {
  local dir=$1 i
  [[ -d "$dir" ]] || die "no directory $dir"
  dir=$(cd "$dir" && pwd)
  export SLURM_CONF=$dir/slurm.conf
  # the jobs first (their steps are slurmd's children, their processes tracked by proctrack): cancelled,
  # and waited for at most KillWait + 25 s
  if [[ -f "$dir/slurmctld.pid" ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    if [[ -n "$(squeue -h -o %i 2>/dev/null)" ]]; then
      scancel --full --quiet $(squeue -h -o %i) 2>/dev/null
      for ((i = 0; i < 150; i++)); do
        [[ -z "$(squeue -h -o %i -t running,completing 2>/dev/null)" ]] && break
        sleep 0.2
      done
    fi
  fi
  stop_one "$dir" slurmd
  stop_one "$dir" slurmd2
  stop_one "$dir" slurmctld
  stop_one "$dir" munged
}

case "${1:-}" in
  start) start "${2:?usage: local_slurm.sh start DIR}" ;;
  stop) stop "${2:?usage: local_slurm.sh stop DIR}" ;;
  install) [[ "$(id -u)" == 0 ]] || skip "installing SLURM needs root"; install_packages ;;
  *) echo "usage: local_slurm.sh start DIR | stop DIR | install" >&2; exit 2 ;;
esac
