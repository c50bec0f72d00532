#!/usr/bin/env bash
# A real one-host Slurm cluster for tests and bench/ (Debian's slurm-wlm and munge): munged,
# slurmctld and slurmd started from a folder of their own, inside a network namespace of their
# own (so Slurm's ports and the sbatch example's store port 6379 are free whatever else runs
# here; only its loopback). Needs root. Processes enter the namespace with nsenter, not `ip netns
# exec`, which would mount a /sys of its own without the cgroup folders slurmd looks for.
#
#   one_host_slurm.sh up DIR [CPUS]   munge key + munged, slurm.conf (node
#       `localhost`, CPUS CPUs whatever the hardware has, default 8; partition `debug`;
#       proctrack/linuxproc and task/none: no cgroups needed), slurmctld -D and slurmd -D; waits
#       (at most 60 s) for `sinfo` to show the node idle. Logs in DIR/log; the sockets in a
#       short folder of /tmp (DIR/sockets names it).
#   one_host_slurm.sh run DIR CMD...  CMD inside the cluster's namespace with SLURM_CONF set
#       (sbatch, srun, squeue, scancel, or a store the jobs reach at localhost); exec'd, so its
#       pid is CMD's.
#   one_host_slurm.sh down DIR        every process in the namespace killed (the daemons, the
#       jobs' steps), the namespace removed; DIR is left to its owner.
set -euo pipefail

ns_of() { cat "$1/netns" 2>/dev/null || true; }
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

down() {
  local dir=$1 ns
  ns=$(ns_of "$dir")
  [ -n "$ns" ] || return 0
  # Only processes of this namespace: the daemons, the job steps they started, and stores.
  for signal in TERM KILL; do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || break
    kill -s $signal $pids 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
  done
  ip netns del "$ns" 2>/dev/null || true
  local short
  short=$(cat "$dir/sockets" 2>/dev/null || true)
  [[ "$short" == /tmp/atslurm.* ]] && rm -rf "$short"
  rm -f "$dir/netns" "$dir/sockets"
}

up() {
  local dir cpus=${2:-8}
  dir=$(realpath "$1")
  [ "$(id -u)" = 0 ] || { echo "one_host_slurm.sh: needs root (ip netns, SlurmUser=root)" >&2; exit 2; }
  for tool in munged slurmctld slurmd sinfo ip; do
    command -v $tool >/dev/null || {
      echo "one_host_slurm.sh: no $tool: install Debian's slurm-wlm, munge and iproute2" >&2
      exit 2
    }
  done
  down "$dir"
  mkdir -p "$dir"/{munge,state,log}
  # Unix sockets (munged's, slurmd's per job step in its spool folder) take paths of at most
  # 108 bytes: they live in a short folder of their own.
  local short
  short=$(mktemp -d /tmp/atslurm.XXXXXX)
  echo "$short" >"$dir/sockets"
  chmod 755 "$short"
  local ns=atslurm$$
  ip netns add $ns
  echo $ns >"$dir/netns"
  ip -n $ns link set lo up
  # An address besides loopback: Slurm resolves names with AI_ADDRCONFIG, which finds no IPv4
  # in a namespace that has only lo (a veth pair: this kernel may lack the dummy module).
  ip -n $ns link add atslurm0 type veth peer name atslurm1
  ip -n $ns addr add 10.78.0.1/24 dev atslurm0
  ip -n $ns link set atslurm0 up
  ip -n $ns link set atslurm1 up

  # munged refuses a key readable by others; its socket's folders must be searchable by all.
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  chmod 755 "$dir" "$dir/munge"
  in_ns $ns munged --force --socket="$short/munge.socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed"

  cat >"$dir/slurm.conf" <<EOF
# A one-host cluster for tests (tests/slurm/one_host_slurm.sh): everything under $dir.
ClusterName=atoll
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Job credentials live 10 s (default 120): Slurm starts a requeued job once they expired.
AuthInfo=socket=$short/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$short/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# A pending job is looked at every second (a requeued one starts as soon as it may).
SchedulerParameters=sched_interval=1
# The node's CPUs as configured, not as this machine has them (a 2-core CI machine runs 4 tasks).
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/slurm.conf
  in_ns $ns slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 &
  in_ns $ns slurmd -D -N localhost >"$dir/log/slurmd.out" 2>&1 &
  local state="" start=$SECONDS
  while ((SECONDS - start < 60)); do
    state=$(timeout 5 nsenter --net=/run/netns/$ns sinfo -h -n localhost -o %T 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.2
  done
  echo "one_host_slurm.sh: the node is not idle after 60 s (sinfo: '${state:-no answer}'); logs in $dir/log:" >&2
  tail -n 20 "$dir"/log/* >&2 || true
  exit 1
}

run() {
  local dir ns
  dir=$(realpath "$1")
  shift
  ns=$(ns_of "$dir")
  [ -n "$ns" ] || { echo "one_host_slurm.sh: no cluster in $dir (run 'up' first)" >&2; exit 2; }
  exec nsenter --net="/run/netns/$ns" env SLURM_CONF="$dir/slurm.conf" "$@"
}

case ${1:-} in
  up) shift; up "$@" ;;
  run) shift; run "$@" ;;
  down) shift; down "$(realpath "$1")" ;;
  *) echo "usage: one_host_slurm.sh up DIR [CPUS] | run DIR CMD... | down DIR" >&2; exit 2 ;;
esac
