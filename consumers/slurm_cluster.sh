#!/usr/bin/env bash
# A private SLURM cluster on 127.0.0.1 for the consumer tier: munged, slurmctld and one slurmd
# per host name given (NodeName=<host> NodeAddr=127.0.0.1, each slurmd on its own port).
#   slurm_cluster.sh start DIR GPUS_PER_HOST HOST...   writes DIR/slurm.conf, starts the daemons
#   slurm_cluster.sh stop DIR                          stops the daemons it started (by pid file)
# Use with SLURM_CONF=DIR/slurm.conf. Needs root (munged, slurmd).
set -euo pipefail
trap 'echo "slurm_cluster.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
cmd=$1 dir=$(realpath -m "$2")
if [ "$cmd" = stop ]; then
  pids=()
  for f in "$dir"/pids/*.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 30); do  # wait until they are gone (their ports free)
    alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && exit 0; sleep 0.5
  done
  exit 0
fi
gpus=$3; shift 3
mkdir -p "$dir"/{spool,state,log,pids,munge}
chmod 755 "$dir"
# munge: a key of our own and a socket of our own (never the machine's munged)
[ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$dir/munge"; chmod 700 "$dir/munge"; chmod 400 "$dir/munge/munge.key"
sock="$dir/munge/munge.socket"
munged --key-file="$dir/munge/munge.key" --socket="$sock" --pid-file="$dir/munge/munged.pid" \
  --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" -f 2>/dev/null || munged --key-file="$dir/munge/munge.key" --socket="$sock" --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" --force
cp "$dir/munge/munged.pid" "$dir/pids/munged.pid" 2>/dev/null || true
cpus=$(( gpus > $(nproc) ? gpus : $(nproc) ))
{
  echo "ClusterName=placer-test"
  echo "SlurmctldHost=localhost(127.0.0.1)"
  echo "SlurmctldPort=17817"
  echo "SlurmUser=root"
  echo "AuthType=auth/munge"
  echo "AuthInfo=socket=$sock"
  echo "StateSaveLocation=$dir/state"
  echo "SlurmdSpoolDir=$dir/spool/%n"
  echo "SlurmctldPidFile=$dir/pids/slurmctld.pid"
  echo "SlurmdPidFile=$dir/pids/slurmd-%n.pid"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "GresTypes=gpu"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "SchedulerType=sched/builtin"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SlurmdTimeout=60"
  echo "SlurmdParameters=config_overrides"  # nodes are as configured (more CPUs and GPUs than this machine has)
  port=17900
  for h in "$@"; do
    port=$((port + 1))
    echo "NodeName=$h NodeAddr=127.0.0.1 NodeHostname=localhost Port=$port CPUs=$cpus Gres=gpu:$gpus RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$dir/slurm.conf"
# stand-in device files: slurmd counts a node's GPUs from the files gres.conf names
mkdir -p "$dir/dev"; for i in $(seq 0 $((gpus - 1))); do [ -e "$dir/dev/gpu$i" ] || mknod -m 666 "$dir/dev/gpu$i" c 1 3; done  # like /dev/null
{ echo "AutoDetect=off"; for h in "$@"; do echo "NodeName=$h Name=gpu File=$dir/dev/gpu[0-$((gpus - 1))]"; done; } > "$dir/gres.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
for h in "$@"; do
  mkdir -p "$dir/spool/$h"
  slurmd -f "$SLURM_CONF" -N "$h"
done
for _ in $(seq 60); do
  idle=$(sinfo -h -N -o "%N %t" 2>/dev/null | awk '$2=="idle"' | wc -l)
  [ "$idle" -ge "$#" ] && { sinfo -N; exit 0; }
  sleep 1
done
echo "slurm_cluster.sh: nodes did not come up" >&2; sinfo -N >&2 || true; tail -n 20 "$dir"/log/* >&2; exit 1
