#!/usr/bin/env bash
# A real local Slurm cluster on this host: munge, slurmctld and four slurmd (node1..node4,
# `slurmd -N`), each with 4 fake A800 GPUs (character devices) and 8 GRES shards, partition gpu.
#
# Usage: cluster.sh install|up|down|status|conf|env [--slurm host|24.11|26.05] [--accounting]
#                   [--sharing shard|mps]
#   install  the host's Slurm: the Debian packages slurmctld slurmd slurm-client munge, when
#            missing; 24.11 or 26.05: the Debian root holding it (slurm-root.sh build)
#   up       install what is missing, write the config, start what is not running, wait
#            until the nodes are idle (resuming them if needed). Safe to run twice. Fails
#            (exit 1) when the slurmctld port is answered by another folder's cluster.
#   down     cancel every job (only when the slurmctld answering is this folder's), wait
#            for them to end, then stop slurmd x4 and slurmctld
#            (munge is a host service other tools share: it is left running)
#   status   print a summary; exit 1 when the cluster is not up
#   conf     print the path of the generated slurm.conf (for `export SLURM_CONF=...`)
#   env      print the shell lines that make this cluster's Slurm the one a shell uses:
#            `eval "$(cluster.sh env --slurm 24.11)"` (PATH: that version's client
#            commands first; SLURM_CONF)
#
# --slurm (default: $ICEFROG_SLURM, else host) chooses the Slurm:
#   host   the host's own packages (22.05 on Debian 12, 24.11 on Debian 13); folder
#          <repo>/var/cluster, slurmctld port 16817, slurmd ports 17001-17004
#   24.11  Debian 13's Slurm from a Debian root (slurm-root.sh: built by debootstrap into
#          <repo>/var/slurm-roots/slurm-24.11 the first time, then kept); the daemons run
#          chrooted into it, the client commands come from <folder>/bin (see `env`);
#          folder <repo>/var/cluster-24.11, ports 16827 and 17011-17014
#   26.05  the same from Debian 14 (forky): var/cluster-26.05, ports 16837 and 17021-17024
# so the three can run at once. $ICEFROG_CLUSTER_DIR, $ICEFROG_CLUSTER_CTLD_PORT,
# $ICEFROG_CLUSTER_NODE_PORT (first slurmd port) and $ICEFROG_SLURM_ROOTS (the folder of the
# Debian roots) override these. The host's munged serves every version.
#
# --accounting (or ICEFROG_CLUSTER_ACCOUNTING=1): Slurm accounting (slurm_conf/dev/accounting.sh):
# `install` adds slurmdbd and mariadb-server, `up` starts a private MariaDB and a slurmdbd
# (ports $ICEFROG_CLUSTER_DBD_PORT and $ICEFROG_CLUSTER_DB_PORT, default the slurmctld port
# + 1 and + 2) before slurmctld, with accounts physics and vision; `down` stops them too.
# Give such a cluster its own folder and ports, e.g. ICEFROG_CLUSTER_DIR=<repo>/var/cluster-acct
# ICEFROG_CLUSTER_CTLD_PORT=16847 ICEFROG_CLUSTER_NODE_PORT=17031.
#
# --sharing (default: $ICEFROG_CLUSTER_SHARING, else shard) chooses the GRES a GPU is shared
# by: shard (8 shards a node, 2 a GPU) or mps (CUDA MPS: 400 mps a node, 100 a GPU; Slurm
# sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a job). One or the other: icefrog asks for one.
# Give an MPS cluster its own folder and ports, e.g. ICEFROG_CLUSTER_DIR=<repo>/var/cluster-mps
# ICEFROG_CLUSTER_CTLD_PORT=16857 ICEFROG_CLUSTER_NODE_PORT=17041.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SLURM_ROOT_SH=$REPO/slurm_conf/dev/slurm-root.sh
COMMAND=${1:-}
SLURM=${ICEFROG_SLURM:-host}
ACCOUNTING=${ICEFROG_CLUSTER_ACCOUNTING:-0}
SHARING=${ICEFROG_CLUSTER_SHARING:-shard}
shift || true
while (($#)); do
    case "$1" in
        --slurm) SLURM=${2:-}; shift 2 || shift ;;
        --slurm=*) SLURM=${1#--slurm=}; shift ;;
        --accounting) ACCOUNTING=1; shift ;;
        --sharing) SHARING=${2:-}; shift 2 || shift ;;
        --sharing=*) SHARING=${1#--sharing=}; shift ;;
        *) echo "cluster.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
case "$SLURM" in
    host) default_dir=$REPO/var/cluster; default_ports=(16817 17001) ;;
    24.11) default_dir=$REPO/var/cluster-24.11; default_ports=(16827 17011) ;;
    26.05) default_dir=$REPO/var/cluster-26.05; default_ports=(16837 17021) ;;
    *) echo "cluster.sh: --slurm must be host, 24.11 or 26.05, not '$SLURM'" >&2; exit 2 ;;
esac
case "$SHARING" in
    shard) share_gres=shard:8; share_line="Name=shard Count=8"; share_note="2 shards a GPU" ;;
    mps) share_gres=mps:400; share_line="Name=mps Count=400"; share_note="100 mps a GPU" ;;
    *) echo "cluster.sh: --sharing must be shard or mps, not '$SHARING'" >&2; exit 2 ;;
esac
DIR=${ICEFROG_CLUSTER_DIR:-$default_dir}
CONF=$DIR/etc/slurm.conf
export SLURM_CONF=$CONF
NODES=(node1 node2 node3 node4)
CTLD_PORT=${ICEFROG_CLUSTER_CTLD_PORT:-${default_ports[0]}}
NODE_PORT0=${ICEFROG_CLUSTER_NODE_PORT:-${default_ports[1]}}
[[ $ACCOUNTING == 1 ]] || ACCOUNTING=0
if ((ACCOUNTING)) && [[ $SLURM != host ]]; then
    echo "cluster.sh: --accounting runs the host's slurmdbd: only with --slurm host" >&2; exit 2
fi
export ICEFROG_ACCT_DIR=$DIR ICEFROG_ACCT_DBD_PORT=${ICEFROG_CLUSTER_DBD_PORT:-$((CTLD_PORT + 1))}
export ICEFROG_ACCT_DB_PORT=${ICEFROG_CLUSTER_DB_PORT:-$((CTLD_PORT + 2))}
ACCOUNTING_SH=$REPO/slurm_conf/dev/accounting.sh
if [[ $SLURM != host ]]; then
    ROOT=${ICEFROG_SLURM_ROOTS:-$REPO/var/slurm-roots}/slurm-$SLURM
    export PATH=$DIR/bin:$PATH  # this version's clients for everything below
fi

log() { echo "cluster.sh: $*" >&2; }

install() {
    if [[ $SLURM != host ]]; then
        command -v munged >/dev/null || install_packages munge
        "$SLURM_ROOT_SH" build "$SLURM" "$ROOT"
        return
    fi
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if ((${#missing[@]})); then install_packages "${missing[@]}"; fi
    if ((ACCOUNTING)); then "$ACCOUNTING_SH" install; fi
}

install_packages() {
    log "installing $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# "22.05", "24.11", ...: major.minor of the chosen Slurm.
slurm_version() {
    if [[ $SLURM != host ]]; then "$SLURM_ROOT_SH" version "$ROOT"; return; fi
    slurmctld -V | sed -n 's/^slurm[^ ]* \([0-9]*\.[0-9]*\).*/\1/p'
}

# Start a daemon of the chosen Slurm (it forks into the background). A version from a
# Debian root runs chrooted into it, with the folders jobs use shared at the same paths:
# the repository (its .venv), the cluster folder, the Python the .venv was made from.
# ICEFROG_CLUSTER_DIR in its environment marks it and what it starts as this folder's.
daemon() {
    if [[ $SLURM == host ]]; then "$@"; return; fi
    local shares=(--share "$REPO") d
    for d in "$DIR" "$ROOT" "$(venv_python_prefix)"; do
        [[ -n $d && $d != /usr* && $d/ != "$REPO"/* ]] && shares+=(--share "$d")
    done
    ICEFROG_CLUSTER_DIR=$DIR "$SLURM_ROOT_SH" run "$ROOT" "${shares[@]}" -- "$@"
}

# The installation the repository's .venv was made from (its pyvenv.cfg `home`, less /bin).
venv_python_prefix() {
    local home
    home=$(sed -n 's/^home *= *//p' "$REPO/.venv/pyvenv.cfg" 2>/dev/null || true)
    [[ -n $home ]] && dirname "$home"
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then return; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    # Another tool may be starting munged at the same moment: a second one exits harmlessly.
    su -s /bin/sh munge -c munged 2>/dev/null || true
    for _ in $(seq 50); do munge_ok && return; sleep 0.1; done
    log "munged does not answer (munge -n | unmunge)"; exit 1
}

write_conf() {
    local version task_line tmp acct_lines=AccountingStorageType=accounting_storage/none
    if ((ACCOUNTING)); then acct_lines=$("$ACCOUNTING_SH" slurm-conf); fi
    version=$(slurm_version)
    case "$version" in
        22.05) task_line="TaskPlugin=task/none" ;;  # removed in 23.11
        *) task_line="# TaskPlugin left at its default (task/none was removed in 23.11)" ;;
    esac
    mkdir -p "$DIR"/{etc,state,log,dev,run,jobs} "${NODES[@]/#/$DIR/spool/slurmd-}"
    chmod 1777 "$DIR/jobs"
    for i in 0 1 2 3; do
        local dev=$DIR/dev/nvidia$i
        if [[ ! -c $dev ]]; then rm -f "$dev"; mknod "$dev" c 1 3; chmod 0666 "$dev"; fi
    done
    tmp=$(mktemp "$DIR/etc/.slurm.conf.XXXX")
    {
    cat <<EOF
# Generated by slurm_conf/dev/cluster.sh for Slurm $version: a 4-node test cluster on one host.
ClusterName=icefrog-dev
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
$task_line
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# as in the production examples: cores and memory are scheduled, with defaults for a job
# that asks for neither (a GPU job: per GPU; a shard or CPU-only job: per core)
DefCpuPerGPU=1
DefMemPerCPU=400
GresTypes=gpu,${SHARING}
ReturnToService=2
$acct_lines
JobCompType=jobcomp/none
KillWait=5
MinJobAge=600
MessageTimeout=5
# a released (resized) job starts at the next pass for queued events, within about a second,
# not batch_sched_delay (default 3 s) after the last pass (docs/controller.md, reallocation)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=200000
NodeName=node[1-4] NodeHostname=localhost Port=[$NODE_PORT0-$((NODE_PORT0 + 3))] CPUs=8 RealMemory=4000 Features=a800,ib Gres=gpu:a800:4,$share_gres State=UNKNOWN
PartitionName=gpu Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP DefMemPerGPU=450
EOF
    if [[ $SLURM != host ]]; then
        # the clients run on the host by the root's loader (slurm-root.sh clients): its
        # plugins by their full path, which the daemons in the root see at the same place
        echo "PluginDir=$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm"
    fi
    } >"$tmp"
    chmod 0644 "$tmp"
    if cmp -s "$tmp" "$CONF"; then rm -f "$tmp"; else mv "$tmp" "$CONF"; CONF_CHANGED=1; fi
    tmp=$(mktemp "$DIR/etc/.gres.conf.XXXX")
    cat >"$tmp" <<EOF
# Fake A800s: character devices, so slurmd sets CUDA_VISIBLE_DEVICES; $share_note.
AutoDetect=off
NodeName=node[1-4] Name=gpu Type=a800 File=$DIR/dev/nvidia[0-3]
NodeName=node[1-4] $share_line File=$DIR/dev/nvidia[0-3]
EOF
    chmod 0644 "$tmp"
    if cmp -s "$tmp" "$DIR/etc/gres.conf"; then rm -f "$tmp"; else mv "$tmp" "$DIR/etc/gres.conf"; CONF_CHANGED=1; fi
    chmod 0644 "$CONF" "$DIR/etc/gres.conf"  # job users (not only root) read the config
}

# The command line `up` starts the daemon of a pid file with (slurmctld.pid, slurmd-NODE.pid).
daemon_cmd() {
    local name
    name=$(basename "$1" .pid)
    case $name in
        slurmctld) echo "slurmctld -f $CONF -i" ;;
        slurmd-*) echo "slurmd -f $CONF -N ${name#slurmd-}" ;;
    esac
}

# pid of a daemon from its pid file, when that process is alive. A pid file can be stale
# while the daemon runs: a second start that lost the race for the port writes its own pid
# there before it dies. Then the daemon is found by its exact command line (the oldest such
# process) and the file repaired, so that `up` never starts a second one and `down` and
# `status` see the one that runs.
alive() {
    local pid cmd
    if [[ -s $1 ]]; then
        pid=$(cat "$1")
        if kill -0 "$pid" 2>/dev/null; then echo "$pid"; return 0; fi
    fi
    cmd=$(daemon_cmd "$1")
    [[ -n $cmd ]] || return 1
    pid=$(pgrep -o -x -f "$cmd") || return 1
    echo "$pid" >"$1"
    echo "$pid"
}

ctld_answers() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# One setting of the slurmctld answering on $CTLD_PORT (`scontrol show config`).
ctld_setting() { scontrol show config 2>/dev/null | sed -n "s/^$1 *= *//p"; }

# The slurmctld answering on $CTLD_PORT is this folder's: its StateSaveLocation and
# SlurmctldPidFile are ours, and the pid in our pid file is alive. Another cluster (another
# folder, e.g. another session's worktree) on the same port must never be used: our `down`
# would cancel its jobs.
ctld_is_ours() {
    [[ $(ctld_setting StateSaveLocation) == "$DIR/state" ]] &&
        [[ $(ctld_setting SlurmctldPidFile) == "$DIR/run/slurmctld.pid" ]] &&
        [[ -n $(alive "$DIR/run/slurmctld.pid") ]]
}

# Exit 1 with a clear message when the port is answered by another cluster's slurmctld.
refuse_foreign_ctld() {
    ctld_answers || return 0
    [[ $(ctld_setting StateSaveLocation) == "$DIR/state" ]] && return 0
    log "port $CTLD_PORT is owned by another cluster's slurmctld" \
        "(StateSaveLocation=$(ctld_setting StateSaveLocation), not $DIR/state);" \
        "stop that cluster or choose free ports with" \
        "ICEFROG_CLUSTER_CTLD_PORT and ICEFROG_CLUSTER_NODE_PORT"
    exit 1
}

wait_idle() {
    local states deadline=$((SECONDS + 90))
    while ((SECONDS < deadline)); do
        states=$(sinfo -h -N -p gpu -o '%N %t' 2>/dev/null | sort -u || true)
        if [[ -n $states ]] && ! grep -qvE ' (idle|mix|alloc|comp)$' <<<"$states"; then
            return 0
        fi
        if grep -qE ' (down|drain|drng|inval|fail)' <<<"$states"; then
            scontrol update nodename=node[1-4] state=resume 2>/dev/null || true
        fi
        sleep 1
    done
    log "nodes did not become idle:"; echo "$states" >&2; exit 1
}

up() {
    CONF_CHANGED=0
    install
    start_munge
    write_conf
    refuse_foreign_ctld
    if [[ $SLURM != host ]]; then "$SLURM_ROOT_SH" clients "$ROOT" "$DIR/bin"; fi
    if ((ACCOUNTING)); then "$ACCOUNTING_SH" up; fi
    if [[ -z $(alive "$DIR/run/slurmctld.pid") ]]; then
        daemon slurmctld -f "$CONF" -i
    elif ((CONF_CHANGED)); then
        scontrol reconfigure || true
    fi
    for _ in $(seq 100); do ctld_answers && break; sleep 0.2; done
    ctld_answers || { log "slurmctld does not answer; see $DIR/log/slurmctld.log"; exit 1; }
    refuse_foreign_ctld
    ctld_is_ours || { log "slurmctld on port $CTLD_PORT is not this folder's; see $DIR/log/slurmctld.log"; exit 1; }
    for n in "${NODES[@]}"; do
        [[ -n $(alive "$DIR/run/slurmd-$n.pid") ]] || daemon slurmd -f "$CONF" -N "$n"
    done
    wait_idle
    echo "cluster up (Slurm $(slurm_version)): export SLURM_CONF=$CONF"
}

# Whether any of these pids is a live process.
any_alive() {
    local pid
    for pid; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}

down() {
    if ctld_answers && ctld_is_ours; then
        local ids deadline=$((SECONDS + 60))
        ids=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $ids ]]; then
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            while ((SECONDS < deadline)) && [[ -n $(squeue -h -o %i 2>/dev/null) ]]; do sleep 0.5; done
        fi
    fi
    # every daemon is asked to stop at once (each takes about 2 s), then waited for: 5 s,
    # then killed
    local pidfile pid pids=() pidfiles=()
    for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"; do
        pid=$(alive "$pidfile") || continue
        kill "$pid"
        pids+=("$pid")
        pidfiles+=("$pidfile")
    done
    for _ in $(seq 50); do
        any_alive "${pids[@]}" || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -9 "$pid"; done
    ((${#pidfiles[@]} == 0)) || rm -f "${pidfiles[@]}"
    [[ $SLURM == host ]] || stop_leftovers
    if ((ACCOUNTING)) || [[ -e $DIR/run/slurmdbd.pid || -e $DIR/run/mysqld.pid ]]; then
        "$ACCOUNTING_SH" down
    fi
    echo "cluster down (state kept under $DIR)"
}

# Processes this folder's cluster started that are still in the Debian root (a job step
# that outlived its slurmd, a job's child that outlived its job): killed, so that the root's
# mount namespaces go with them. Ours: the daemons' mark, or a job's SLURM_CONF.
stop_leftovers() {
    local p pids=()
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] || continue
        tr '\0' '\n' <"$p/environ" 2>/dev/null |
            grep -qxF -e "ICEFROG_CLUSTER_DIR=$DIR" -e "SLURM_CONF=$CONF" || continue
        pids+=("${p#/proc/}")
    done
    ((${#pids[@]})) || return 0
    log "stopping leftover processes in $ROOT: ${pids[*]}"
    kill -9 "${pids[@]}" 2>/dev/null || true
}

env_lines() {
    if [[ $SLURM != host ]]; then printf 'export PATH=%q:"$PATH"\n' "$DIR/bin"; fi
    printf 'export SLURM_CONF=%q\n' "$CONF"
}

status() {
    local rc=0 pid n
    echo "folder:     $DIR"
    echo "SLURM_CONF: $CONF"
    [[ $SLURM == host ]] || echo "root:       $ROOT"
    [[ -f $CONF ]] && echo "version:    Slurm $(slurm_version)"
    munge_ok && echo "munged:     up" || { echo "munged:     DOWN"; rc=1; }
    if pid=$(alive "$DIR/run/slurmctld.pid") && ctld_answers && ctld_is_ours; then
        echo "slurmctld:  up (pid $pid)"
    else
        echo "slurmctld:  DOWN"; rc=1
    fi
    for n in "${NODES[@]}"; do
        if pid=$(alive "$DIR/run/slurmd-$n.pid"); then echo "slurmd $n: up (pid $pid)"
        else echo "slurmd $n: DOWN"; rc=1; fi
    done
    if ((ACCOUNTING)); then "$ACCOUNTING_SH" status || rc=1; fi
    if ((rc == 0)); then
        sinfo -N -p gpu -o '%N %t %G' || rc=1
        echo "jobs: $(squeue -h -o %i | wc -l)"
    fi
    return $rc
}

case "$COMMAND" in
    install) install ;;
    up) up ;;
    down) down ;;
    status) status ;;
    conf) echo "$CONF" ;;
    env) env_lines ;;
    *) echo "usage: $0 install|up|down|status|conf|env [--slurm host|24.11|26.05] [--accounting] [--sharing shard|mps]" >&2; exit 2 ;;
esac
