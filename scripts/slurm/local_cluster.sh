#!/bin/sh
# scripts/slurm/local_cluster.sh — a throw-away single-node Slurm cluster in one directory (munged,
# slurmctld, slurmd), for testing the launcher on one machine. Must not touch the host's own
# Slurm or MUNGE setup: every file, socket, port and state directory is private to DIR.
#
# usage: local_cluster.sh start DIR    (as root; prints `export SLURM_CONF=DIR/slurm.conf`)
#        local_cluster.sh stop DIR     (stops exactly the daemons whose pid files are in DIR)
# start exits 77 with a reason when the cluster cannot run here (not root, a binary missing).
set -eu

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '6,8p' "$0" | sed 's/^# //' >&2; exit 2; }

stop() {
  for name in slurmd slurmctld munged; do
    pidfile=$dir/$name.pid
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case $pid in ''|*[!0-9]*) rm -f "$pidfile"; continue ;; esac
    kill "$pid" 2>/dev/null || true
    n=0
    while kill -0 "$pid" 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

skip() { echo "local_cluster.sh: cannot start a cluster here: $*" >&2; exit 77; }

case $cmd in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "local_cluster.sh: unknown command '$cmd' (start | stop)" >&2; exit 2 ;;
esac

[ "$(id -u)" -eq 0 ] || skip "not root (munged must run as user munge, slurmd as root)"
for b in munged mungekey slurmctld slurmd sbatch sinfo runuser; do
  command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
  command -v "$b" >/dev/null 2>&1 || skip "'$b' not found (Debian: apt-get install slurm-wlm munge)"
done
id munge >/dev/null 2>&1 || skip "there is no user 'munge'"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
trap 'stop' EXIT INT TERM # a failed start leaves nothing running

# MUNGE: a fresh key and a private socket, all owned by munge (munged refuses anything looser);
# every path munged uses is given, so the host's /run/munge is neither needed nor created
m=$dir/munge
mkdir -p "$m"
chmod 755 "$dir"
# munged runs as munge: every directory above the cluster must let it through
if ! runuser -u munge -- test -x "$m"; then
  echo "local_cluster.sh: user munge cannot reach '$dir' (a directory above it is not searchable by others; chmod o+x it, or use another place)" >&2
  exit 2
fi
chown munge:munge "$m"
chmod 755 "$m" # the socket directory must be searchable by every client
mungekey --create --keyfile="$m/munge.key" --force >/dev/null 2>&1 || dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 2>/dev/null
chown munge:munge "$m/munge.key"
chmod 400 "$m/munge.key"
runuser -u munge -- munged --key-file="$m/munge.key" --socket="$m/munge.socket" --pid-file="$m/munged.pid" \
  --log-file="$m/munged.log" --seed-file="$m/munged.seed" || skip "munged did not start: $(tail -3 "$m/munged.log" 2>/dev/null)"
n=0
while [ ! -s "$m/munged.pid" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
cp "$m/munged.pid" "$dir/munged.pid"

# Slurm: this host as the only node, with its real CPU count and memory; ports away from 6817/6818
host=$(hostname -s)
node=$(slurmd -C | head -1)
port=$(( 20000 + $$ % 5000 * 2 ))
mkdir -p "$dir/state" "$dir/spool"
cat >"$dir/slurm.conf" <<CONF
ClusterName=ember-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$m/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=ember Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -c -f "$SLURM_CONF" || skip "slurmctld did not start: $(tail -3 "$dir/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" -N "$host" || skip "slurmd did not start: $(tail -3 "$dir/slurmd.log" 2>/dev/null)"
n=0
until [ "$(sinfo -h -o %T 2>/dev/null | head -1)" = idle ]; do
  n=$((n + 1))
  [ $n -lt 150 ] || { echo "local_cluster.sh: the node did not become idle in 30 s:" >&2; tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2; exit 1; }
  sleep 0.2
done
trap - EXIT INT TERM
echo "export SLURM_CONF=$dir/slurm.conf"
