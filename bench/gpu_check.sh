#!/usr/bin/env bash
# planc's checks on a machine with CUDA GPUs: the numbers docs/gpu.md reports. From the repository root:
#
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh [STEP ...]
#
# PLAN=plans/gpu/llama3-8b-4layers-1xh200.plan runs the steps that use the 8B-shaped plan on an H200.
#
# Steps (default: all, in the order of the list at the end; each is independent, its log in
# logs/<step>.log of the archive $OUT/gpu-check.tar.gz, rewritten after every step so a cut-off
# run still returns it):
#   env        torch, CUDA and the GPU; planc's strategies registered
#   verify     planc verify of plans/gpu/llama3-8b-4layers-1xh100.plan (Llama 3 8B's block, head and
#              vocabulary, 4 layers, seq 8192): model states, saved activations, CUDA peak, step time
#   calibrate  `planc calibrate --plan` for the plan above; on an H100, also the calibration worker over
#              every GEMM and attention shape of the published H100 runs (bench/published_calibrated.py)
#   run        planc run of that plan and bench/handwritten_one_gpu.py --fused on the same plan (fused
#              AdamW, as planc runs on CUDA), two rounds alternating which goes first: step times side by
#              side, losses (same data and initialisation)
#   resume     plans/gpu/tiny-1xh100.plan to step 10 (checkpoints at 5 and 10), resumed to 16, and 16
#              steps straight: DCP on CUDA
#   variants   planc verify of the 8B-shaped plan with recompute = full, and with micro_batch = 2
#   selective  planc verify of it with recompute = selective (torchtitan's setting for Llama 3 8B)
#   profile    bench/handwritten_one_gpu.py on that plan with step 3 under torch.profiler: kernel
#              time by kind (GEMM, attention, loss, optimizer, other) against the step's wall time
#   loss       bench/loss_speed.py: one micro-batch's loss (8192 x 128,256 bf16 logits), the whole-tensor
#              cross-entropy against planc's chunked loss each way and chunk size: time and peak memory
#   weights    plans/gpu/tiny-1xh100.plan to step 10, `planc export` of it (safetensors), and a run
#              that starts from the export (`model from ... { init = pretrained }`): the weights path on CUDA
#   nearfull   planc verify of the plan deepened until its predicted peak is ~99% of the usable memory
#              (NEARFULL="20:none 28:full", layers:recompute, sized for an H200; not in the default steps)
#   sustained  bench/gpu_sustained.py: one GEMM back to back for 20 s, rate and SM clock per second
#   layouts    with 2 or more GPUs: bench/gpu_layouts.py (DDP, ZeRO-1, FSDP, TP + SP, 1F1B under planc
#              verify on the node; with 8, TP 8 against TP 4 x ZeRO-3 and TP 2 x ZeRO-3 for a 70B block)
# nvidia-smi logs clock, power, temperature and utilisation every second to smi.csv meanwhile.
#
# Python packages the GPU machine lacks (lark, pydantic, and planc's own entry points: a wheel of
# this checkout) travel as wheels in .whl, installed into /tmp/site when the imports fail; the
# repository goes first on PYTHONPATH so the code is this checkout's. To make them (Python 3.12,
# the GPU image's): pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d .whl lark pydantic pydantic_core annotated-types
# typing-inspection typing_extensions (the versions pip list shows here), then
# pip wheel --no-deps --no-build-isolation -w .whl . for planc itself.
set -u
OUT=${OUT:-runs/gpu-check}
WORK=${WORK:-/tmp/planc-gpu-check}
LOGS=$WORK/logs
mkdir -p "$OUT" "$WORK" "$LOGS"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ! python3 -c "import lark, pydantic, planc.strategies" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "gpu_check: installing .whl failed"
  export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
PLAN=${PLAN:-plans/gpu/llama3-8b-4layers-1xh100.plan}  # overridable, to try the script on CPU plans
TINY=${TINY:-plans/gpu/tiny-1xh100.plan}
# The plan's device preset (H100-SXM, H200, ...), for the calibration's file names and whether the
# published H100 runs are priced with this GPU's rates.
DEVICE=$(sed -nE 's/^ *device *= *"([^"]+)".*/\1/p' "$PLAN" | head -n 1)
NAME=$(echo "$DEVICE" | tr 'A-Z' 'a-z')

planc() { python3 -m planc "$@"; }

# step NAME SECONDS: run the function step_NAME with a time limit, its output to $LOGS/NAME.log.
step() {
  local name=$1 limit=$2 began=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c "step_$name" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - began)) s"
  grep -E "^(RESULT|planc verify|  )" "$LOGS/$name.log" | tail -n 40
  [ $rc -ne 0 ] && tail -n 25 "$LOGS/$name.log"
  # The device tool returns at most 8 files: everything but the profiles goes into one archive.
  tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" --exclude='checkpoints' --exclude='*.pt' --exclude='*.distcp' --exclude='*.safetensors' . 2>/dev/null
  return 0
}

step_env() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, sys; print('RESULT torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
  planc --version
  planc plugins 2>&1 | head -20
}

step_verify() {
  planc verify "$PLAN" --steps 6 --out "$WORK/verify-none"
  cp "$WORK/verify-none/verify.json" "$WORK/verify-none.json"
}

step_calibrate() {
  planc calibrate --plan "$PLAN" --out "$OUT/$NAME-plan.json"
  echo "RESULT plan profile written"
  # The published runs are H100 (and A100) runs: pricing them with this GPU's rates only means
  # something on an H100.
  [ "$DEVICE" = H100-SXM ] || return 0
  python3 bench/published_calibrated.py workload --device H100-SXM --out "$WORK/published-workload.json"
  python3 -m planc.calibrate.worker --workload "$WORK/published-workload.json" --out "$OUT/h100-published.json" --budget 0.1
  echo "RESULT published profile written"
  python3 bench/published_calibrated.py compare "$OUT/h100-published.json" --device H100-SXM | tail -n 8
}

step_run() {
  # Two rounds, alternating which program goes first (as bench/overhead.py does on CPU): one
  # program's step moved by 10% between two runs on the first H100 (docs/gpu.md).
  local round
  for round in 1 2; do
    if [ $round = 1 ]; then
      planc run "$PLAN" --out "$WORK/run-$round" --steps 12
      python3 bench/handwritten_one_gpu.py "$WORK/run-$round/plan.json" 12 "$WORK/handwritten-$round.json" --fused
    else
      python3 bench/handwritten_one_gpu.py "$WORK/run-1/plan.json" 12 "$WORK/handwritten-$round.json" --fused
      planc run "$PLAN" --out "$WORK/run-$round" --steps 12
    fi
    cp "$WORK/run-$round/metrics.jsonl" "$WORK/run-metrics-$round.jsonl"
  done
  python3 - "$WORK" <<'EOF'
import json, statistics, sys
work = sys.argv[1]
gaps = lambda xs: [b - a for a, b in zip(xs, xs[1:])][3:]
planc_steps, hand_steps, ratios = [], [], []
for round_ in (1, 2):
    planc = [json.loads(line) for line in open(f"{work}/run-metrics-{round_}.jsonl")]
    hand = json.load(open(f"{work}/handwritten-{round_}.json"))
    p, h = gaps([r["elapsed_s"] for r in planc]), gaps(hand["wall_s"])
    planc_steps += p
    hand_steps += h
    ratios.append(statistics.median(p) / statistics.median(h))
    print(f"RESULT round {round_}: planc {statistics.median(p):.4f} s  hand-written {statistics.median(h):.4f} s  ratio {ratios[-1]:.3f}")
p, h = statistics.median(planc_steps), statistics.median(hand_steps)
print(f"RESULT step planc {p:.4f} s  hand-written {h:.4f} s  ratio of medians {p / h:.3f}  per-round {' '.join(f'{r:.3f}' for r in ratios)}  predicted {planc[-1]['predicted_step_s']:.4f} s")
print(f"RESULT peak planc {planc[-1]['memory_bytes'] / 2**30:.2f} GiB  hand-written {hand['peak_bytes'][0] / 2**30:.2f} GiB")
print("RESULT loss planc    ", " ".join(f"{r['loss']:.4f}" for r in planc[:5]), "...", f"{planc[-1]['loss']:.4f}")
print("RESULT loss hand     ", " ".join(f"{x:.4f}" for x in hand["loss"][:5]), "...", f"{hand['loss'][-1]:.4f}")
EOF
}

step_resume() {
  planc run "$TINY" --out "$WORK/tiny-resumed" --steps 10
  planc run "$TINY" --out "$WORK/tiny-resumed" --steps 16
  planc run "$TINY" --out "$WORK/tiny-straight" --steps 16
  python3 - "$WORK/tiny-resumed/metrics.jsonl" "$WORK/tiny-straight/metrics.jsonl" <<'EOF'
import json, sys
resumed = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
straight = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2])) if "loss" in r}
worst = max(abs(resumed[s] - straight[s]) for s in straight)
print(f"RESULT resume steps {sorted(resumed)[0]}..{max(resumed)}; largest |loss difference| against straight: {worst:.2e}")
print("RESULT resumed ", " ".join(f"{resumed[s]:.4f}" for s in sorted(resumed)[-6:]))
print("RESULT straight", " ".join(f"{straight[s]:.4f}" for s in sorted(straight)[-6:]))
EOF
}

step_variants() {
  sed 's/recompute = none/recompute = full/' "$PLAN" >"$WORK/full.plan"
  planc verify "$WORK/full.plan" --steps 6 --out "$WORK/verify-full"
  cp "$WORK/verify-full/verify.json" "$WORK/verify-full.json"
  sed -E 's/^(  micro_batch += )1$/\12/' "$PLAN" >"$WORK/mb2.plan"
  planc verify "$WORK/mb2.plan" --steps 6 --out "$WORK/verify-mb2"
  cp "$WORK/verify-mb2/verify.json" "$WORK/verify-mb2.json"
}

step_selective() {
  sed 's/recompute = none/recompute = selective/' "$PLAN" >"$WORK/selective.plan"
  planc verify "$WORK/selective.plan" --steps 6 --out "$WORK/verify-selective"
  cp "$WORK/verify-selective/verify.json" "$WORK/verify-selective.json"
}

step_profile() {
  planc check --json "$PLAN" >"$WORK/plan-check.json"
  for optimizer in foreach fused; do
    python3 bench/handwritten_one_gpu.py "$WORK/plan-check.json" 5 "$WORK/profile-$optimizer.json" --profile-step 3 \
      $([ $optimizer = fused ] && echo --fused)
    python3 - "$WORK/profile-$optimizer.json" "$optimizer" <<'EOF'
import json, sys
record = json.load(open(sys.argv[1]))
gaps = [b - a for a, b in zip(record["wall_s"], record["wall_s"][1:])]
print(f"RESULT {sys.argv[2]} AdamW: steps", " ".join(f"{g:.3f}" for g in gaps), "s; kernels in the profiled step:",
      " ".join(f"{n} {v * 1e3:.1f} ms" for n, v in record["kernels"].items()))
if sys.argv[2] == "foreach":
    for kind, name, seconds, launches in record["top_kernels"][:30]:
        print(f"RESULT   {seconds * 1e3:7.2f} ms {launches:5d}x {kind:9} {name[:95]}")
EOF
  done
}

step_loss() {
  python3 bench/loss_speed.py
}

step_weights() {
  planc run "$TINY" --out "$WORK/tiny-first" --steps 10
  planc export "$WORK/tiny-first" --to "$WORK/tiny-exported"
  ls -la "$WORK/tiny-exported"
  # The tiny plan's hardware and training, its model read back from the export.
  { echo 'model from "tiny-exported" { init = pretrained }'
    sed -n '/^hardware {/,/^}/p; /^train {/,/^}/p; /^layout {/,/^}/p' "$TINY"; } >"$WORK/continued.plan"
  cat "$WORK/continued.plan"
  planc run "$WORK/continued.plan" --out "$WORK/tiny-continued" --steps 3
  python3 - "$WORK/tiny-first/metrics.jsonl" "$WORK/tiny-continued/metrics.jsonl" <<'EOF'
import json, sys
first = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
continued = [r for r in map(json.loads, open(sys.argv[2])) if "loss" in r]
print("RESULT weights: first run's losses", " ".join(f"{r['loss']:.4f}" for r in first))
print("RESULT weights: run from its export", " ".join(f"{r['loss']:.4f}" for r in continued),
      f"(step 1 of the same data from random weights: {first[0]['loss']:.4f})")
EOF
}

step_nearfull() {
  # The plan deepened until the model puts its peak at ~99% of the usable memory (the device less
  # planc's 5% headroom): does a layout the planner calls a fit run, and how close is the peak?
  # NEARFULL lists LAYERS:RECOMPUTE pairs; the default is for an H200's 141 GB.
  local pair layers recompute
  for pair in ${NEARFULL:-20:none 28:full}; do
    layers=${pair%%:*} recompute=${pair##*:}
    sed -E "s/^(  layers +=) .*/\1 $layers/; s/recompute = none/recompute = $recompute/" "$PLAN" >"$WORK/near-$layers-$recompute.plan"
    planc explain "$WORK/near-$layers-$recompute.plan" | grep -E "^ +total"
    planc verify "$WORK/near-$layers-$recompute.plan" --steps 5 --out "$WORK/verify-near-$layers-$recompute"
    cp "$WORK/verify-near-$layers-$recompute/verify.json" "$WORK/verify-near-$layers-$recompute.json"
  done
}

step_sustained() {
  python3 bench/gpu_sustained.py --seconds 20
}

step_layouts() {
  local gpus
  gpus=$(nvidia-smi -L | wc -l)
  if [ "$gpus" -lt 2 ]; then
    echo "RESULT layouts: $gpus GPU(s) here, the layouts need 2 or more"
    return 0
  fi
  python3 bench/gpu_layouts.py --gpus "$gpus" --out "$WORK/layouts"
}

export -f planc step_env step_verify step_calibrate step_run step_resume step_variants step_selective step_profile step_sustained step_nearfull step_layouts step_weights step_loss
export PLAN TINY OUT WORK LOGS DEVICE NAME

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -l 1 \
  >"$WORK/smi.csv" 2>/dev/null &
steps=("$@")
# Most wanted first (a lease is short and a call can be cut off): the multi-GPU layouts where there
# are several GPUs, then what re-checks the second session's changes that never ran on a GPU (the
# 2**26 loss chunk and the next rows built during the step, in `run` against the hand-written loop;
# `verify`; `loss`), then the weights path and the first session's checks.
[ ${#steps[@]} -eq 0 ] && steps=(env layouts run verify loss weights profile resume selective variants sustained calibrate)
for s in "${steps[@]}"; do
  case $s in
    env) step env 60 ;;
    verify) step verify 180 ;;
    calibrate) step calibrate 200 ;;
    run) step run 300 ;;
    resume) step resume 150 ;;
    variants) step variants 240 ;;
    selective) step selective 120 ;;
    profile) step profile 120 ;;
    sustained) step sustained 60 ;;
    nearfull) step nearfull 300 ;;
    weights) step weights 150 ;;
    loss) step loss 90 ;;
    layouts) step layouts 560 ;;
    *) echo "gpu_check: unknown step $s (env verify calibrate run resume variants selective profile sustained layouts weights loss)" ;;
  esac
done
ls -la "$OUT"
