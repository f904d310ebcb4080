#!/usr/bin/env bash
# A single-node Slurm on this machine (slurmctld + slurmd on localhost, munge), to try the cluster path
# (docs/cluster.md) on a laptop or in CI: `sudo scripts/slurm_local.sh start`, then sbatch/srun as on a
# cluster; `scripts/slurm_local.sh stop` ends the daemons, `status` says whether jobs would run.
#
# start: installs slurm-wlm and munge with apt-get where missing (root), writes /etc/slurm/slurm.conf for
# this machine's cores and memory (`slurmd -C`; never over a slurm.conf this script did not write),
# starts munged, slurmctld and slurmd, and waits until `srun` runs a task (exit 1 with the daemons'
# log lines when it does not). Idempotent: daemons already up are kept.
# Anything else (no argument, an empty or unknown one) is a usage error: exit 2, nothing started.
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# written by pretrain scripts/slurm_local.sh"
LOGS=/var/log/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
WAIT_S=${SLURM_LOCAL_WAIT_S:-90}

say() { echo "slurm_local: $*" >&2; }
die() {
	say "error: $*"
	exit 1
}
USAGE="usage: $0 start|stop|status"
usage_error() {
	say "error: $*; $USAGE"
	exit 2
}

need_root() {
	[ "$(id -u)" = 0 ] || die "$1 needs root: sudo $0 ${ACTION}"
}

install() {
	if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
		return
	fi
	need_root "installing slurm-wlm and munge"
	command -v apt-get >/dev/null || die "slurmctld/slurmd/munged are missing and there is no apt-get: install Slurm (22.05+) and munge with the system's package manager"
	say "installing slurm-wlm and munge (apt-get, a minute)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q slurm-wlm munge >/dev/null
}

write_conf() {
	if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
		say "keeping $CONF: it was not written by this script (remove it to let this script write one)"
		return
	fi
	local host node cpus memory
	host=$(hostname -s)
	# `slurmd -C` reports this machine's layout; the node offers 90 % of its memory to jobs.
	node=$(slurmd -C | head -n 1)
	cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
	memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
	memory=$((memory * 9 / 10))
	node=$(sed "s/ RealMemory=[0-9]*/ RealMemory=${memory}/" <<<"$node")
	mkdir -p "$(dirname "$CONF")"
	local tmp="$CONF.tmp.$$"
	cat >"$tmp" <<EOF
$MARK for $host: ${cpus} CPUs, ${memory} MB for jobs.
ClusterName=pretrain-local
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}
SlurmdSpoolDir=${SPOOL}
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd.log
# No cgroups (containers, laptops): processes tracked by their parents, tasks not pinned.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$((memory / cpus))
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
# No slurmdbd: sacct is off; squeue and scontrol show job report the jobs.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
${node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
	mv "$tmp" "$CONF"
	say "wrote $CONF (${cpus} CPUs, RealMemory=${memory} MB)"
}

# The daemons by their pid files (never by name: other processes may share it).
pidfile() {
	case "$1" in
	munged) echo /run/munge/munged.pid ;;
	*) echo "/run/$1.pid" ;;
	esac
}
running() {
	local pid
	pid=$(cat "$(pidfile "$1")" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

start_munge() {
	if running munged; then return; fi
	if [ ! -s /etc/munge/munge.key ]; then
		mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
	fi
	chown munge:munge /etc/munge/munge.key
	chmod 0400 /etc/munge/munge.key
	mkdir -p /run/munge /var/log/munge /var/lib/munge
	chown munge:munge /run/munge /var/log/munge /var/lib/munge
	runuser -u munge -- munged
}

start_slurm() {
	mkdir -p "$LOGS" "$STATE" "$SPOOL"
	running slurmctld || slurmctld
	running slurmd || slurmd
}

ready() {
	# A task runs: the whole path (munge, controller, node daemon, launch) works.
	local deadline=$((SECONDS + WAIT_S))
	until timeout 30 srun --quiet --ntasks=1 --time=1 --job-name=slurm-local-check true 2>/dev/null; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			say "error: no task ran within ${WAIT_S} s; sinfo says:"
			sinfo -N -l >&2 || true
			tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
			return 1
		fi
		# A node left down by an earlier run is resumed (ReturnToService covers most cases).
		scontrol update NodeName="$(hostname -s)" State=RESUME 2>/dev/null || true
		sleep 2
	done
}

# The action is explicit: `start` installs and starts daemons as root, never a default.
[ "$#" = 1 ] || usage_error "expected one action, got $#"
ACTION=$1
case "$ACTION" in
start)
	if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && running slurmctld && running slurmd &&
		timeout 30 srun --quiet --ntasks=1 --time=1 --job-name=slurm-local-check true 2>/dev/null; then
		say "already running: $(sinfo -h -o '%P %D node(s), %c CPUs, %m MB, %T')"
		exit 0
	fi
	install
	need_root "starting the daemons"
	write_conf
	start_munge
	start_slurm
	ready
	say "ready: $(sinfo -h -o '%P %D node(s), %c CPUs, %m MB, %T')"
	;;
stop)
	need_root "stopping the daemons"
	for daemon in slurmd slurmctld munged; do
		if running "$daemon"; then kill "$(cat "$(pidfile "$daemon")")" && say "stopped $daemon"; fi
	done
	;;
status)
	if command -v sinfo >/dev/null && timeout 10 sinfo -h -o '%P %D node(s), %c CPUs, %m MB, %T' 2>/dev/null; then
		exit 0
	fi
	say "not running: sudo $0 start"
	exit 1
	;;
-h | --help)
	echo "$USAGE"
	;;
*)
	usage_error "unknown action '${ACTION}'"
	;;
esac
