#!/usr/bin/env bash
# A newer Slurm beside the host's: a Debian root (debootstrap) holding that version's daemons
# and client commands, used by cluster.sh --slurm 24.11|26.05.
#
# Usage:
#   slurm-root.sh build VERSION ROOT       make ROOT (Debian with Slurm VERSION) unless it is
#                                          there and complete; exit 1 when Debian's suite no
#                                          longer has that version
#   slurm-root.sh run ROOT [--share DIR]... -- COMMAND [ARG]...
#                                          run COMMAND chrooted into ROOT in a private mount
#                                          namespace (a daemon keeps it; it and its mounts go
#                                          when the last process in it ends)
#   slurm-root.sh clients ROOT BINDIR      write BINDIR/{sbatch,scontrol,...}: that version's
#                                          client commands, run on the host by ROOT's own
#                                          dynamic loader (no root privilege, no chroot)
#   slurm-root.sh version ROOT             print major.minor of ROOT's Slurm
#
# Which suite: 24.11 -> trixie (Debian 13), 26.05 -> forky (Debian 14, testing). No Debian
# suite has 25.11. Inside the root: the host's munged (its socket folder /run/munge is
# shared: munge's protocol does not change between these releases), the host's user
# database and /etc/hosts (symlinks into the host's /etc, mounted read-only at
# /run/host-etc), /dev, /proc, /sys, /tmp, /home, /root and each --share folder at the same
# path (the repository, the cluster folder, the Python the repository's .venv is made from).
set -euo pipefail

MIRROR=${ICEFROG_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The daemons and clients; the rest are the shared libraries of a Python built on Debian 12
# (pyenv, uv), so that the host's .venv runs inside the root (its glibc is newer: fine).
PACKAGES=slurmctld,slurmd,slurm-client,munge,procps,libssl3t64,libreadline8t64,libsqlite3-0,libffi8,libbz2-1.0,libncursesw6,libstdc++6,libexpat1,libuuid1,liblzma5,zlib1g,libcrypt1
CLIENTS=(sbatch scontrol squeue sinfo scancel sacct srun salloc sprio sdiag)
HOST_ETC=(passwd group shadow gshadow hosts)

log() { echo "slurm-root.sh: $*" >&2; }

suite_of() {
    case "$1" in
        24.11) echo trixie ;;
        26.05) echo forky ;;
        *) log "no Debian suite known for Slurm '$1' (24.11 or 26.05)"; exit 2 ;;
    esac
}

version() {
    chroot "$1" /usr/sbin/slurmctld -V | sed -n 's/^slurm[^ ]* \([0-9]*\.[0-9]*\).*/\1/p'
}

# The marker written last: a root without it (an interrupted build) is built again.
marker() { echo "$1/etc/icefrog-slurm-root"; }

build() {
    local want=$1 root=$2 suite script tmp got
    suite=$(suite_of "$want")
    built() { [[ -f $(marker "$root") ]] && [[ $(cat "$(marker "$root")") == "$want $PACKAGES" ]]; }
    built && return 0
    mkdir -p "$(dirname "$root")"
    exec 9>"$root.lock"
    flock 9  # another `up` building the same root: wait for it, then use its root
    built && return 0
    command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    # an older debootstrap has no script for a newer suite: they all follow sid's
    script=/usr/share/debootstrap/scripts/$suite
    [[ -e $script ]] || script=/usr/share/debootstrap/scripts/sid
    tmp="$root.build"
    rm -rf "$tmp"
    log "building $root: Debian $suite with Slurm $want (a few minutes, ~300 MB)"
    nice -n 10 debootstrap --variant=minbase --include="$PACKAGES" \
        "$suite" "$tmp" "$MIRROR" "$script" >"$tmp.log" 2>&1 ||
        { log "debootstrap failed; see $tmp.log"; tail -5 "$tmp.log" >&2; exit 1; }
    got=$(version "$tmp")
    if [[ $got != "$want" ]]; then
        log "Debian $suite now has Slurm $got, not $want"; exit 1
    fi
    mkdir -p "$tmp/run/host-etc" "$tmp/run/munge"
    for f in "${HOST_ETC[@]}"; do ln -sfn "/run/host-etc/$f" "$tmp/etc/$f"; done
    echo "$want $PACKAGES" >"$(marker "$tmp")"
    rm -rf "$root" "$tmp.log"
    mv "$tmp" "$root"
    log "built $root (Slurm $(version "$root"))"
}

# Inside the new mount namespace (run's second half): mount, chroot, exec.
enter() {
    local root=$1 d
    shift
    local shares=()
    while [[ ${1:-} == --share ]]; do shares+=("$2"); shift 2; done
    [[ ${1:-} == -- ]] && shift
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --bind /run/munge "$root/run/munge"
    mount --bind /etc "$root/run/host-etc"
    mount -o remount,bind,ro "$root/run/host-etc"
    for d in /tmp /home /root "${shares[@]}"; do
        [[ -d $d ]] || continue
        mkdir -p "$root$d"
        mount --rbind "$d" "$root$d"
    done
    exec chroot "$root" "$@"
}

run() {
    local root=$1
    shift
    [[ -f $(marker "$root") ]] || { log "$root is not built (slurm-root.sh build)"; exit 1; }
    exec unshare --mount --propagation private -- "${BASH_SOURCE[0]}" _enter "$root" "$@"
}

clients() {
    local root=$1 bin=$2 lib name tmp
    lib=$root/usr/lib/x86_64-linux-gnu
    mkdir -p "$bin"
    for name in "${CLIENTS[@]}"; do
        tmp=$(mktemp "$bin/.$name.XXXX")
        printf '#!/bin/sh\n# Slurm %s'"'"'s %s, run by its own dynamic loader (slurm_conf/dev/slurm-root.sh)\nexec %q --inhibit-cache --library-path %q --argv0 %q %q "$@"\n' \
            "$(version "$root")" "$name" "$root/lib64/ld-linux-x86-64.so.2" \
            "$lib:$lib/slurm-wlm" "$name" "$root/usr/bin/$name" >"$tmp"
        chmod 0755 "$tmp"
        mv "$tmp" "$bin/$name"
    done
}

case "${1:-}" in
    build) build "${2:?version}" "${3:?root}" ;;
    run) shift; run "$@" ;;
    _enter) shift; enter "$@" ;;
    clients) clients "${2:?root}" "${3:?bin folder}" ;;
    version) version "${2:?root}" ;;
    *) echo "usage: $0 build VERSION ROOT | run ROOT [--share DIR]... -- CMD... | clients ROOT BINDIR | version ROOT" >&2; exit 2 ;;
esac
