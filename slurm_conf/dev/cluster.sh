#!/usr/bin/env bash
# A real local Slurm cluster on this host (slurmctld + node1..node4 with fake A800 GPUs).
# Usage: cluster.sh install|up|down|status
# (install: the Debian packages slurmctld slurmd slurm-client munge, when missing)
set -euo pipefail

install() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    if ((${#missing[@]})); then
        echo "cluster.sh: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

case "${1:-}" in
    install) install ;;
    *) echo "usage: $0 install|up|down|status" >&2; exit 2 ;;
esac
