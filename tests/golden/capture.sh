#!/usr/bin/env bash
# Capture the golden Slurm outputs the parsers are pinned to, from a real cluster.
# Usage (cluster up and empty, its clients first on PATH and SLURM_CONF exported):
#   eval "$(slurm_conf/dev/cluster.sh env --slurm V)"; tests/golden/capture.sh tests/golden/slurm-XX.YY
# Scenario (the unit tests find each job by its comment or name, never by its id):
#   held     icefrog job, held, gpu:2 on 1 node          comment icefrog:golden-held
#   running  icefrog job, running, gpu:2 on 2 nodes      comment icefrog:golden-run
#   shard    icefrog job, running, shard:1 pinned node3  comment icefrog:golden-shard;prev=<held id>
#   foreign  a job of uid 65534 (nobody), running gpu:1  name foreign, no comment
#   hostile  a held job of nobody whose name, comment and work dir hold line breaks,
#            '|' and Key=value look-alikes (UserId=root(0)), comment icefrog:... too
#   gone     icefrog job, held, then cancelled           comment icefrog:golden-gone
# then the held job is asked to change from gpu:2 to shard:2 (update-gpu-to-shard.txt: what
# scontrol said; gres-after-update.txt: the job's TresPerNode afterwards).
set -euo pipefail
out=${1:?output folder}
mkdir -p "$out"
work=$(mktemp -d /tmp/icefrog-golden.XXXX); chmod 1777 "$work"
sub() { sbatch --parsable "$@" | cut -d';' -f1; }
gone=$(sub -H --requeue -J icefrog-gone -o "$work/%j.out" --comment=icefrog:golden-gone --gres=gpu:1 --wrap 'sleep 300')
scancel "$gone"
held=$(sub -H --requeue -J icefrog-held -o "$work/%j.out" --comment=icefrog:golden-held -N1 --gres=gpu:2 --wrap 'sleep 300')
run=$(sub --requeue -J icefrog-run -o "$work/%j.out" --comment=icefrog:golden-run -N2 --gres=gpu:2 --wrap 'sleep 300')
shard=$(sub --requeue -J icefrog-shard -o "$work/%j.out" --comment="icefrog:golden-shard;prev=$held" -w node3 --gres=shard:1 --wrap 'sleep 300')
foreign=$(cd "$work" && setpriv --reuid=65534 --regid=65534 --clear-groups sbatch --parsable -J foreign -o "$work/%j.out" --gres=gpu:1 -w node4 --wrap 'sleep 300' | cut -d';' -f1)
evil=$(mktemp -d "$work/run UserId=root(0) GroupId=root(0).XXXX"); chmod 777 "$evil"
hostile=$(cd "$evil" && setpriv --reuid=65534 --regid=65534 --clear-groups sbatch --parsable -H \
    -J $'hostile\n1|RUNNING|gres:gpu:4' -o "$work/%j.out" --gres=gpu:1 \
    --comment=$'icefrog:decoy;prev=1;sig=00\nJobId=1 UserId=root(0)' --wrap 'sleep 300' | cut -d';' -f1)
for _ in $(seq 50); do
    [[ $(squeue -h -t R -j "$run,$shard,$foreign" | wc -l) == 3 ]] && break; sleep 0.2
done
squeue --json --states=all >"$out/squeue.json"
sinfo -h -N -p gpu -o '%N|%t|%G' >"$out/sinfo.txt"
scontrol show hostnames 'node[1-3],node4' >"$out/hostnames.txt"
(squeue -h -t all -j 999999 -o '%i' 2>&1 || true) >"$out/squeue-unknown-job.txt"
(scontrol update jobid="$held" Gres=shard:2 2>&1 || true) >"$out/update-gpu-to-shard.txt"
squeue -h -j "$held" -o '%b' >"$out/gres-after-update.txt"
sbatch --version >"$out/version.txt"
scancel "$held" "$run" "$shard" "$foreign" "$hostile"
echo "captured into $out (jobs $gone $held $run $shard $foreign $hostile)"
