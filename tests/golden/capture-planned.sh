#!/usr/bin/env bash
# Capture sinfo of a node the backfill scheduler plans for a pending job (sinfo-planned.txt).
# Usage (cluster up and empty, its clients first on PATH and SLURM_CONF exported):
#   eval "$(slurm_conf/dev/cluster.sh env --slurm V)"; tests/golden/capture-planned.sh tests/golden/slurm-XX.YY
# Scenario: a job holds node4's four GPUs for up to 10 minutes; a two-node job that needs
# node3 and node4 waits for it, and the next backfill pass (bf_interval, 30 s) plans node3,
# idle, for it: 24.11 and later show node3 as "plnd" (and node4 with a "-" suffix).
set -euo pipefail
out=${1:?output folder}
work=$(mktemp -d /tmp/icefrog-golden.XXXX)
sub() { sbatch --parsable -p gpu -o /dev/null --chdir="$work" "$@" | cut -d';' -f1; }
busy=$(sub -w node4 --gres=gpu:4 --time=10 --wrap 'sleep 300')
wide=$(sub -N2 -w 'node[3-4]' --gres=gpu:4 --time=5 --wrap 'sleep 300')
for _ in $(seq 90); do  # up to one backfill pass and a half
    sinfo -h -N -p gpu -o '%N|%t' | grep -q -e '^node3|plnd' -e '^node4|mix-' && break
    sleep 0.5
done
sinfo -h -N -p gpu -o '%N|%t|%G' >"$out/sinfo-planned.txt"
scancel "$busy" "$wide"
echo "captured into $out/sinfo-planned.txt"
