#!/usr/bin/env bash
# Capture one version's golden outputs on a cluster of its own, new and empty: it comes up
# in <repo>/var/golden-cluster (slurmctld port 16867, slurmd ports 17051-17054, so it never
# meets a cluster of cluster.sh's default ports), capture.sh runs, and it is brought down
# and removed.
# Usage: tests/golden/capture-fresh.sh host|24.11|26.05   (writes tests/golden/slurm-<X.Y>)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=${1:?host, 24.11 or 26.05}
export ICEFROG_CLUSTER_DIR=$REPO/var/golden-cluster
export ICEFROG_CLUSTER_CTLD_PORT=16867 ICEFROG_CLUSTER_NODE_PORT=17051
cluster=("$REPO/slurm_conf/dev/cluster.sh")
"${cluster[@]}" down --slurm "$version" >/dev/null 2>&1 || true
rm -rf "$ICEFROG_CLUSTER_DIR"
trap '"${cluster[@]}" down --slurm "$version" >/dev/null; rm -rf "$ICEFROG_CLUSTER_DIR"' EXIT
"${cluster[@]}" up --slurm "$version" >/dev/null
eval "$("${cluster[@]}" env --slurm "$version")"
release=$(sinfo -V | sed -n 's/^slurm[^ ]* \([0-9]*\.[0-9]*\).*/\1/p')
"$REPO/tests/golden/capture.sh" "$REPO/tests/golden/slurm-$release"
