#!/usr/bin/env bash
# A real single-node SLURM cluster on Debian 12 (bookworm), for trying theseus's submitit path:
# munge, MariaDB + slurmdbd (so that `sacct` works: submitit polls it for a job's state), slurmctld
# and slurmd, one node (this host) in a partition named `cpu`. No cgroups (proctrack/linuxproc,
# task/none), so it also runs in a container or sandbox.
#
#   sudo bash .ci/setup-slurm.sh          install (first time), configure, start the daemons; idempotent
#   sudo bash .ci/setup-slurm.sh stop     stop the daemons this script starts (by their pid files)
#   sudo bash .ci/setup-slurm.sh status   what runs, sinfo
#
# Settings (environment): SLURM_PARTITION (cpu), SLURM_CLUSTER (local), SLURM_MIN_CPUS (2: a
# node with fewer cores is declared with this many, so that a 2-task job fits, oversubscribed).
#
# Without systemd (a container) the daemons are started by hand; where systemd runs, this script
# starts and stops the packages' units instead (that branch is untested).
set -euo pipefail

PARTITION=${SLURM_PARTITION:-cpu}
CLUSTER=${SLURM_CLUSTER:-local}
MIN_CPUS=${SLURM_MIN_CPUS:-2}
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
LOGS=/var/log/slurm
MARIADB_PID=/run/mysqld/mysqld.pid
MUNGE_PID=/run/munge/munged.pid

log() { echo "setup-slurm: $*"; }
die() { echo "setup-slurm: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
has_systemd() { [ -d /run/systemd/system ]; }

# wait_for SECONDS WHAT COMMAND...: retry COMMAND every second until it succeeds
wait_for() {
    local seconds=$1 what=$2; shift 2
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    die "$what did not come up within ${seconds}s (see $LOGS/)"
}

# alive PIDFILE NAME: the process in PIDFILE runs and its command is NAME
alive() {
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

# stop_pid PIDFILE NAME: SIGTERM the process in PIDFILE (if it is NAME), wait up to 30 s for it
stop_pid() {
    local pidfile=$1 name=$2 pid
    if ! alive "$pidfile" "$name"; then log "$name: not running"; rm -f "$pidfile"; return 0; fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 30); do [ -d "/proc/$pid" ] || break; sleep 1; done
    if [ -d "/proc/$pid" ]; then log "$name ($pid) ignored SIGTERM for 30 s: SIGKILL"; kill -KILL "$pid"; fi
    # slurmctld and slurmdbd run as the slurm user and cannot remove their pid files from /run:
    # a stale one makes the slurmctld package's prerm run scancel, which fails, and dpkg stops.
    rm -f "$pidfile"
    log "$name ($pid) stopped"
}

stop_all() {
    if has_systemd; then
        systemctl stop slurmd slurmctld slurmdbd mariadb munge || true
        return
    fi
    stop_pid /run/slurmd.pid slurmd
    stop_pid /run/slurmctld.pid slurmctld
    stop_pid /run/slurmdbd.pid slurmdbd
    stop_pid "$MARIADB_PID" mariadbd
    stop_pid "$MUNGE_PID" munged
}

status() {
    local pair
    for pair in munged:$MUNGE_PID mariadbd:$MARIADB_PID slurmdbd:/run/slurmdbd.pid \
                slurmctld:/run/slurmctld.pid slurmd:/run/slurmd.pid; do
        if alive "${pair#*:}" "${pair%%:*}"; then log "${pair%%:*}: running, pid $(cat "${pair#*:}")"
        else log "${pair%%:*}: not running"; fi
    done
    sinfo 2>&1 || true
}

case "${1:-start}" in
    stop) stop_all; exit 0 ;;
    status) status; exit 0 ;;
    start) ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac

# 1. Packages. Debian's policy-rc.d in containers keeps their services from starting: fine, they
#    are started below.
need=()
for pkg in slurm-wlm slurmdbd munge mariadb-server; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

# 2. Folders the daemons expect (/run is a tmpfs: recreated on every start).
install -d -o munge -g munge -m 0755 /run/munge
install -d -o mysql -g mysql -m 0755 /run/mysqld
install -d -o slurm -g slurm -m 0755 "$LOGS" /var/spool/slurmctld
install -d -o root -g root -m 0755 /var/spool/slurmd

# 3. The munge key (the package makes one; one is made here if it is missing).
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

# 4. slurm.conf: this host as the one node, its CPUs and sockets as slurmd detects them, memory
#    below the machine's (90%).
NODE=$(hostname -s)
getent hosts "$NODE" >/dev/null || die "hostname $NODE does not resolve: add it to /etc/hosts"
hw=$(slurmd -C | head -n 1)
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$hw"; }
CPUS=$(field CPUs); SOCKETS=$(field SocketsPerBoard); CORES=$(field CoresPerSocket)
THREADS=$(field ThreadsPerCore); MEM=$(( $(field RealMemory) * 9 / 10 ))
node_line="NodeName=$NODE CPUs=$CPUS Boards=1 SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS RealMemory=$MEM State=UNKNOWN"
overrides=""
if [ "$CPUS" -lt "$MIN_CPUS" ]; then  # a 1-core host: declare MIN_CPUS CPUs and accept the mismatch
    node_line="NodeName=$NODE CPUs=$MIN_CPUS RealMemory=$MEM State=UNKNOWN"
    overrides="SlurmdParameters=config_overrides"
fi
new_conf=$(cat <<EOF
# Written by setup-slurm.sh: one node, no cgroups.
ClusterName=$CLUSTER
SlurmctldHost=$NODE
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=slurm
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$overrides
$node_line
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
)
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
    log "writing $CONF"
    printf '%s\n' "$new_conf" > "$CONF"
fi
chmod 0644 "$CONF"

# 5. slurmdbd.conf, with a password of its own for MariaDB (kept across runs).
DB_PASS=$(sed -n 's/^StoragePass=//p' "$DBD_CONF" 2>/dev/null || true)
[ -n "$DB_PASS" ] || DB_PASS=$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 24 || true)
new_dbd=$(cat <<EOF
# Written by setup-slurm.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
)
if [ ! -f "$DBD_CONF" ] || [ "$(cat "$DBD_CONF")" != "$new_dbd" ]; then
    log "writing $DBD_CONF"
    printf '%s\n' "$new_dbd" > "$DBD_CONF"
fi
chown slurm:slurm "$DBD_CONF"
chmod 0600 "$DBD_CONF"

if has_systemd; then
    systemctl restart munge mariadb
else
    # 6. munged, as the munge user (it forks into the background).
    if ! alive "$MUNGE_PID" munged; then
        log "starting munged"
        runuser -u munge -- /usr/sbin/munged
    fi
    # 7. MariaDB (it stays in the foreground: detached here).
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    if ! alive "$MARIADB_PID" mariadbd; then
        log "starting mariadbd"
        setsid /usr/sbin/mariadbd --user=mysql --pid-file="$MARIADB_PID" </dev/null >>"$LOGS/mariadb.log" 2>&1 &
    fi
fi
wait_for 30 munged munge -n
wait_for 60 mariadbd mariadb-admin ping
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
            ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

# 8. slurmdbd, the cluster registered in it, then slurmctld and slurmd (each forks).
if has_systemd; then
    systemctl restart slurmdbd
else
    if ! alive /run/slurmdbd.pid slurmdbd; then log "starting slurmdbd"; slurmdbd; fi
fi
wait_for 60 slurmdbd sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi
if has_systemd; then
    systemctl restart slurmctld slurmd
else
    if alive /run/slurmctld.pid slurmctld; then scontrol reconfigure
    else log "starting slurmctld"; slurmctld; fi
    if ! alive /run/slurmd.pid slurmd; then log "starting slurmd"; slurmd; fi
fi
wait_for 60 slurmctld scontrol ping

# 9. The node up and idle; a 2-task step runs.
node_ready() { sinfo -h -n "$NODE" -o %t | grep -Eq '^(idle|mix|alloc)'; }
for _ in $(seq 30); do node_ready && break; sleep 1; done
if ! node_ready; then
    scontrol update nodename="$NODE" state=resume 2>/dev/null || true
    wait_for 30 "node $NODE" node_ready
fi
sinfo
out=$(timeout 120 srun -p "$PARTITION" -n 2 sh -c 'echo "job $SLURM_JOB_ID task $SLURM_PROCID on $(hostname)"') \
    || die "srun -n 2 failed"
printf '%s\n' "$out"
[ "$(wc -l <<<"$out")" = 2 ] || die "srun -n 2 printed $(wc -l <<<"$out") lines, not 2"
job=$(sed -n '1s/^job \([0-9]*\) .*/\1/p' <<<"$out")
wait_for 30 "sacct (job $job in slurmdbd)" sh -c "sacct -n -X -j $job -o State | grep -q COMPLETED"
sacct -X -j "$job" -o JobID,JobName,State,ExitCode
log "ready: partition $PARTITION, node $NODE ($([ -n "$overrides" ] && echo "$MIN_CPUS CPUs declared" || echo "$CPUS CPUs"), ${MEM} MB)"
