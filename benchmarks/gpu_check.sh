#!/usr/bin/env bash
# The job side's checks that need a CUDA GPU, as one script (run on a machine with one GPU;
# results go to $OUT, default ./gpu-results). Each part is bounded by `timeout`.
# Run from the repository root with the project installed (pip install -e '.[launcher]');
# the benchmarks run as modules (python -m benchmarks.NAME).
#   1. benchmarks/trainer.py on CUDA: step time vs frozen layers of a ResNet18-width model
#      (width 64) at batch 32/128/256, eq 6 fitted with its APE (the paper: <= 10 %), and the
#      gradient statistics' overhead.
#   2. examples/train_digits.py through torchrun (nccl, 1 process) to its target: the trainer's
#      reports carry NVML utilisation and CUDA peak memory (the profile samples are printed).
#   3. benchmarks/gpu_share.py: two jobs on one GPU, eq 8's verdict vs the measured lambda.
set -u
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  nvidia-smi -L
  $PY -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
} 2>&1 | tee "$OUT/env.txt"
for b in 32 128 256; do
  timeout 150 $PY -m benchmarks.trainer --width 64 --batch "$b" --steps 30 --repeats 3 \
    --rounds 5 --threads 4 2>&1 | tee "$OUT/trainer_b$b.txt"
done
rm -rf /tmp/gpu-digits && mkdir -p /tmp/gpu-digits/inbox
ICEFROG_INBOX=/tmp/gpu-digits/inbox ICEFROG_WORKDIR=/tmp/gpu-digits/wd SLURM_JOB_ID=1 \
  ICEFROG_TARGET='val_acc>=0.95' ICEFROG_MAX_EPOCHS=40 ICEFROG_BATCH=32-128 \
  timeout 150 $PY -m torch.distributed.run --nproc-per-node 1 --standalone examples/train_digits.py --model cnn \
  > "$OUT/digits.txt" 2>&1
echo "torchrun exit $?" >> "$OUT/digits.txt"
$PY - >> "$OUT/digits.txt" 2>&1 <<'PYEOF'
import json, pathlib
for p in sorted(pathlib.Path("/tmp/gpu-digits/inbox").rglob("*.json")):
    env = json.loads(p.read_text())
    pay = env.get("payload", {})
    if env.get("kind") in ("profile", "finished"):
        print(env["kind"], json.dumps(pay)[:600])
PYEOF
tail -25 "$OUT/digits.txt"
timeout 240 $PY -m benchmarks.gpu_share --seconds 6 2>&1 | tee "$OUT/share.txt"
