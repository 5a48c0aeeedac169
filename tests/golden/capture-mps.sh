#!/usr/bin/env bash
# Capture the golden Slurm outputs of a cluster that shares GPUs by CUDA MPS (gres/mps).
# Usage (an MPS cluster up and empty, its clients first on PATH and SLURM_CONF exported):
#   export ICEFROG_CLUSTER_DIR=$PWD/var/cluster-mps ICEFROG_CLUSTER_CTLD_PORT=16857 \
#          ICEFROG_CLUSTER_NODE_PORT=17041
#   slurm_conf/dev/cluster.sh up --sharing mps; eval "$(slurm_conf/dev/cluster.sh env)"
#   tests/golden/capture-mps.sh tests/golden/slurm-22.05-mps
# (24.11: ICEFROG_CLUSTER_DIR=$PWD/var/cluster-mps-24.11, ports 16877 and 17061,
# `up --slurm 24.11 --sharing mps`, `eval "$(... env --slurm 24.11)"`, into slurm-24.11-mps;
# 26.05: var/cluster-mps-26.05, ports 16887 and 17071, into slurm-26.05-mps.)
# Scenario (the unit tests find each job by its comment or name, never by its id):
#   mps-a    icefrog job, running, mps:30 pinned node1     comment icefrog:golden-mps-a
#   mps-b    icefrog job, running, mps:60 pinned node1     comment icefrog:golden-mps-b
#   foreign  a job of uid 65534 (nobody), running mps:50 on node2, name foreign-mps
#   held     icefrog job, held, gpu:1                      comment icefrog:golden-held
#   held-mps icefrog job, held, mps:20                     comment icefrog:golden-held-mps
# then the held gpu job is asked to become mps:40 (update-gpu-to-mps.txt) and the held mps
# job mps:45 (update-mps-count.txt; gres-after-mps-update.txt: its TresPerNode afterwards);
# a shard request is tested against the MPS partition (shard-on-mps.txt). job-env-a.txt and
# job-env-b.txt: the GPU variables Slurm gave each mps job's batch step.
set -euo pipefail
out=${1:?output folder}
mkdir -p "$out"
work=$(mktemp -d /tmp/icefrog-golden-mps.XXXX); chmod 1777 "$work"
sub() { sbatch --parsable "$@" | cut -d';' -f1; }
show_env='env | grep -E "^(CUDA_|SLURM_JOB_GPUS|SLURM_GPUS|GPU_DEVICE_ORDINAL)" | sort; sleep 300'
a=$(sub --requeue -J icefrog-mps-a -o "$work/a.out" --comment=icefrog:golden-mps-a -w node1 --gres=mps:30 --wrap "$show_env")
b=$(sub --requeue -J icefrog-mps-b -o "$work/b.out" --comment=icefrog:golden-mps-b -w node1 --gres=mps:60 --wrap "$show_env")
foreign=$(cd "$work" && setpriv --reuid=65534 --regid=65534 --clear-groups sbatch --parsable -J foreign-mps -o "$work/%j.out" --gres=mps:50 -w node2 --wrap 'sleep 300' | cut -d';' -f1)
held=$(sub -H --requeue -J icefrog-held -o "$work/%j.out" --comment=icefrog:golden-held -N1 --gres=gpu:1 --wrap 'sleep 300')
heldm=$(sub -H --requeue -J icefrog-held-mps -o "$work/%j.out" --comment=icefrog:golden-held-mps -N1 --gres=mps:20 --wrap 'sleep 300')
for _ in $(seq 100); do
    [[ $(squeue -h -t R -j "$a,$b,$foreign" | wc -l) == 3 && -s $work/a.out && -s $work/b.out ]] && break
    sleep 0.2
done
squeue --json --states=all >"$out/squeue.json"
scontrol show node -d node1 >"$out/scontrol-node-d.txt"
sinfo -h -N -p gpu -o '%N|%t|%G' >"$out/sinfo.txt"
cp "$work/a.out" "$out/job-env-a.txt"; cp "$work/b.out" "$out/job-env-b.txt"
(scontrol update jobid="$held" Gres=mps:40 2>&1 || true) >"$out/update-gpu-to-mps.txt"
(scontrol update jobid="$heldm" Gres=mps:45 2>&1 || true) >"$out/update-mps-count.txt"
squeue -h -j "$heldm" -o '%b' >"$out/gres-after-mps-update.txt"
(sbatch --test-only -p gpu --gres=shard:1 --wrap true 2>&1 || true) | sed 's/job [0-9]*/job N/' >"$out/shard-on-mps.txt"
sbatch --version >"$out/version.txt"
scancel "$a" "$b" "$foreign" "$held" "$heldm"
echo "captured into $out (jobs $a $b $foreign $held $heldm)"
