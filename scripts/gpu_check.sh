#!/usr/bin/env bash
# specbench device check: one GPU, no internet, under 8 minutes.
#
#   bash scripts/gpu_check.sh [--out DIR] [--wheels DIR] [--budget SECONDS] [--work DIR]
#   bash scripts/gpu_check.sh --only pytest,fastpath             # those steps alone (after env and install)
#   bash scripts/gpu_check.sh --cpu-smoke [--out DIR]     # the same plumbing on CPU, tiny shapes (~1 min)
#   bash scripts/gpu_check.sh --fetch-wheels [--wheels DIR]  # where PyPI is reachable: fill the wheel folder
#   bash scripts/gpu_check.sh --rehearse [--wheels DIR]      # install the wheels beside the image's versions (Python 3.12)
#
# Steps (each under `timeout`, capped by what is left of --budget; a failed step does not stop the
# next; the exit status is 1 if any step failed or was skipped). Times: measured CPU smoke / GPU estimate.
#   env       nvidia-smi, python, torch/CUDA                                   cpu  2 s / gpu   5 s, cap  30 s
#   install   pip install --no-index --find-links WHEELS WHEELS/*.whl (hydra-core, omegaconf, antlr4,
#             optuna + alembic, sqlalchemy, mako, colorlog, platformdirs: what the image lacks; its own
#             torch, transformers >= 5.17 and the rest stay), pip install --no-deps -e . ; then
#             a KV-cache check (incremental logits == a full forward)         cpu  5 s / gpu  25 s, cap  90 s
#   pytest    pytest -m gpu tests (CPU smoke: tests/test_gpu.py, collected and skipped) cpu 10 s / gpu  90 s, cap 120 s
#   sweep     gamma 1,2,4,6 x batch 1,4,16,64: 8B-shape target, 1B-shape draft, bf16, eager,
#             synthetic prompts, 32 new tokens (conf/sweep/gpu_check.yaml); every job also runs
#             the C_t(k) micro-benchmark, k = 1..16 (ct.parquet); then C_o share, host syncs and
#             NVML energy per token per job (sweep_summary.txt)                cpu 25 s / gpu 180 s, cap 200 s
#   report    python -m specbench.report <sweep> (cost model, optimal gamma per batch size) cpu 10 s / gpu 30 s, cap 60 s
#   fastpath  python -m specbench.gpu fastpath: eager vs compiled (CUDA graphs) side by side, 8B/1B
#             shapes cut to 8 layers each (compile time), B = 1 (FASTPATH_BATCHES=1,16 for more), plain and gamma 4  cpu 10 s / gpu 100 s, cap 120 s
#   equality  greedy speculative == autoregressive on shape-only Llama-3.2-1B,
#             float32 (must match) and bfloat16 (margins reported)          cpu  5 s / gpu  40 s, cap  60 s
# --budget (default 470 s) bounds the whole run: one command inside the GPU machine's 8 minutes.
#
# Output (at most 8 files, flat, as the device tool returns them): DIR/gpu_check.log, steps.json,
# pytest_gpu.txt, report.md, ct.csv (the sweep's C_t(k) rows), fastpath.json, greedy_equality.json,
# results.tar.gz (the sweep's job dirs with rounds, requests, ct and telemetry tables, sweep_summary.txt,
# and the full report with plots). DIR defaults to $OUT when set, else ./gpu_check_out.
#
# The wheel folder (where PyPI is reachable): `bash scripts/gpu_check.sh --fetch-wheels` downloads, for
# CPython 3.12 on manylinux x86-64, the versions installed here of the packages the GPU image lacks
# (`specbench.gpu.wheels.MISSING_ON_IMAGE`), through pip's own configured index. Keep wheels/ out of git and
# name it in the device tool's `carry`. `--rehearse` checks the set installs beside the image's versions
# (`specbench.gpu.wheels.IMAGE_PINS`) in a fresh Python 3.12 venv, as the install step does there.

set -u

MODE=gpu
OUTDIR="${OUT:-}"
WORK=""
WHEELS=wheels
BUDGET=470
ONLY=""  # --only pytest,fastpath: run those steps (env and install always run)
PY="${PYTHON:-python3}"

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) MODE=cpu ;;
    --fetch-wheels) MODE=fetch ;;
    --rehearse) MODE=rehearse ;;
    --out) OUTDIR="$2"; shift ;;
    --work) WORK="$2"; shift ;;
    --wheels) WHEELS="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    --only) ONLY=",$2,"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO" || exit 2
case "$WHEELS" in /*) ;; *) WHEELS="$REPO/$WHEELS" ;; esac

if [ "$MODE" = fetch ]; then
  mkdir -p "$WHEELS"
  read -r -a pins <<< "$("$PY" -m specbench.gpu.wheels)"
  binary=() sdist=()
  for p in "${pins[@]}"; do case "$p" in antlr4-python3-runtime*) sdist+=("$p") ;; *) binary+=("$p") ;; esac; done
  echo "fetching into $WHEELS: ${pins[*]}"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${binary[@]}" || exit 1
  [ ${#sdist[@]} -eq 0 ] || "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "${sdist[@]}" || exit 1
  du -sh "$WHEELS"; ls "$WHEELS"
  exit 0
fi

if [ "$MODE" = rehearse ]; then
  # The install step as the GPU machine runs it, in a fresh Python 3.12 venv holding the image's versions.
  PY312="${PY312:-python3.12}"
  VENV="$(mktemp -d "${TMPDIR:-/tmp}/specbench_rehearse.XXXXXX")"
  "$PY312" -m venv "$VENV" || exit 1
  read -r -a image <<< "$("$PY" -m specbench.gpu.wheels image)"
  "$VENV/bin/python" -m pip install -q "${image[@]}" || exit 1
  "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl || exit 1
  "$VENV/bin/python" -c '
import platform
from importlib.metadata import version
import hydra, omegaconf, optuna, platformdirs, transformers  # what the app and the tuner import
print("  python", platform.python_version())
for n in ("transformers", "huggingface_hub", "hydra-core", "omegaconf", "optuna", "sqlalchemy"):
    print(" ", n, version(n))
'
  rc=$?
  rm -rf "$VENV"
  echo "rehearsal: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
  exit $rc
fi

[ -n "$OUTDIR" ] || OUTDIR="$REPO/gpu_check_out"
mkdir -p "$OUTDIR" || exit 2
OUTDIR="$(cd "$OUTDIR" && pwd)"
[ -n "$WORK" ] || WORK="$(mktemp -d "${TMPDIR:-/tmp}/specbench_gpu_check.XXXXXX")"
mkdir -p "$WORK" && WORK="$(cd "$WORK" && pwd)"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
exec 3>&1 4>&2 > >(tee -a "$LOG") 2>&1
TEE_PID=$!
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # specbench even if the editable install fails
# CPU smoke: one thread per process; on a busy small machine OpenMP's spinning threads make
# tiny forwards hundreds of times slower.
[ "$MODE" = cpu ] && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

START=$(date +%s)
STEPS="$WORK/steps.tsv"
: > "$STEPS"
FAILED=()

# step NAME CAP_SECONDS COMMAND...: run under timeout, capped by the remaining budget.
step() {
  local name=$1 cap=$2; shift 2
  local now left t rc status begin
  if [ -n "$ONLY" ] && [ "$name" != env ] && [ "$name" != install ] && [[ "$ONLY" != *",$name,"* ]]; then
    echo "=== $name: not asked for (--only)"; return
  fi
  now=$(date +%s); left=$((BUDGET - (now - START)))
  if [ "$left" -lt 15 ]; then
    echo "=== $name: SKIPPED (${left}s of the ${BUDGET}s budget left)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" skipped "" 0 "$cap" >> "$STEPS"
    FAILED+=("$name"); return
  fi
  t=$(( cap < left ? cap : left ))
  echo "=== $name (cap ${t}s, $(( now - START ))s elapsed) ==="
  begin=$(date +%s)
  # A fresh bash runs the step (functions are exported): timeout kills its whole process group.
  timeout --kill-after=10 "$t" bash -c '"$@"' _ "$@"; rc=$?
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  echo "=== $name: $status (rc $rc, $(( $(date +%s) - begin ))s)"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(( $(date +%s) - begin ))" "$t" >> "$STEPS"
  [ "$status" = ok ] || FAILED+=("$name")
}

env_check() {
  echo "mode=$MODE repo=$REPO out=$OUTDIR work=$WORK budget=${BUDGET}s python=$(command -v "$PY")"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PY" - "$MODE" <<'EOF'
import platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
sys.exit(1 if sys.argv[1] == "gpu" and not torch.cuda.is_available() else 0)
EOF
}

install() {
  if [ "$MODE" = gpu ]; then
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl || return 1
    else
      echo "no wheels in $WHEELS: using what is installed (see --help to fill it)"
    fi
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
      || echo "editable install failed: using PYTHONPATH=$REPO"
  fi
  # The versions, then a KV-cache check: CachedLM's incremental logits must equal a full
  # forward (transformers older than the `cache=` keyword would silently ignore the cache).
  "$PY" - "$MODE" <<'EOF'
import sys
from importlib.metadata import version
for name in ("hydra-core", "omegaconf", "optuna", "transformers", "torch", "nvidia-ml-py"):
    try:
        print(f"  {name} {version(name)}")
    except Exception as e:
        print(f"  {name} MISSING ({e})")
import hydra, omegaconf, optuna, platformdirs  # noqa: F401  the app and tuner need them
import torch
from specbench.decoding.kvcache import CachedLM
from specbench.models.shapes import build_shape_only_model
device = "cuda" if sys.argv[1] == "gpu" else "cpu"
model = build_shape_only_model("tiny-llama", dtype=torch.float32, device=device)
ids = [[5, 6, 7, 8, 9, 10]]
lm = CachedLM(model)
with torch.inference_mode():
    lm.prefill([ids[0][:3]])
    inc = lm.feed(torch.tensor([ids[0][3:]], device=device))[0, -1]
    full = model(input_ids=torch.tensor(ids, device=device)).logits[0, -1]
err = float((inc - full).abs().max())
print(f"  KV-cache check: max |incremental - full| = {err:.2e}")
sys.exit(0 if err < 1e-4 else 1)
EOF
}

pytest_gpu() {
  local args=(-m gpu -q -rs -p no:cacheprovider)
  if [ "$MODE" = gpu ]; then args+=(tests); else args+=(tests/test_gpu.py); fi
  "$PY" -m pytest "${args[@]}" 2>&1 | tee "$OUTDIR/pytest_gpu.txt"
  return "${PIPESTATUS[0]}"
}

equality() {
  if [ "$MODE" = gpu ]; then
    "$PY" -m specbench.gpu equality --device cuda --shape llama-3.2-1b --dtypes float32,bfloat16 \
      --gammas 1,4 --batch 4 --new-tokens 32 --out "$OUTDIR/greedy_equality.json"
  else
    "$PY" -m specbench.gpu equality --device cpu --shape tiny-llama --init-range 0.3 --dtypes float32,bfloat16 \
      --gammas 4 --batch 3 --new-tokens 12 --out "$OUTDIR/greedy_equality.json"
  fi
}

fastpath() {
  if [ "$MODE" = gpu ]; then
    "$PY" -m specbench.gpu fastpath --device cuda --layers 8 --batch-sizes "${FASTPATH_BATCHES:-1}" --gamma 4 --new-tokens 32 \
      --repeats 3 --compile-mode reduce-overhead --out "$OUTDIR/fastpath.json"
  else  # the static path uncompiled: the same code but inductor, which costs minutes on CPU
    "$PY" -m specbench.gpu fastpath --device cpu --target-shape tiny-llama --draft-shape tiny-llama --dtype float32 \
      --batch-sizes 2 --gamma 2 --new-tokens 6 --prompt-tokens 8 --repeats 1 --compile-mode none \
      --out "$OUTDIR/fastpath.json"
  fi
}

sweep() {
  local args
  if [ "$MODE" = gpu ]; then
    args=(pair=llama8b_1b_shape gamma=1,2,4,6 batch_size=1,4,16,64)
  else
    # the static path, as fastpath's: inductor's max-autotune compiles cost ~85 s of a ~2 min smoke on CPU
    args=(pair=tiny gamma=1,2 batch_size=1,2 max_new_tokens=6 workload.prompt_tokens=12 repeats=1 warmup=0 forward=static)
  fi
  "$PY" -m specbench draft=model workload=synthetic +sweep=gpu_check "${args[@]}" \
      runs_dir="$WORK/runs" sweep_name=gpu_check report=false 2>&1 | grep --line-buffered -v 'batch/s' | tee "$WORK/sweep_summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  "$PY" -m specbench.gpu summary "$WORK/runs/gpu_check" | tee -a "$WORK/sweep_summary.txt"
  return "${PIPESTATUS[0]}"
}

report() {
  "$PY" -m specbench.report "$WORK/runs/gpu_check" --out "$WORK/report"
}

pack() {
  [ -f "$WORK/report/report.md" ] && cp "$WORK/report/report.md" "$OUTDIR/report.md"
  "$PY" -c "from specbench.bench.runstore import load_sweep; import sys; load_sweep(sys.argv[1], 'ct').to_csv(sys.argv[2], index=False)" \
    "$WORK/runs/gpu_check" "$OUTDIR/ct.csv" 2>/dev/null || echo "no C_t table to export"
  local parts=()
  for p in runs report steps.tsv sweep_summary.txt; do [ -e "$WORK/$p" ] && parts+=("$p"); done
  [ ${#parts[@]} -gt 0 ] && tar czf "$OUTDIR/results.tar.gz" -C "$WORK" "${parts[@]}"
  "$PY" - "$STEPS" "$OUTDIR/steps.json" "$MODE" "$BUDGET" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
steps = [{"step": n, "status": s, "rc": int(rc) if rc else None, "seconds": int(sec), "cap_s": int(cap)}
         for n, s, rc, sec, cap in rows]
out = {"mode": sys.argv[3], "budget_s": int(sys.argv[4]), "elapsed_s": int(sys.argv[5]),
       "ok": all(s["status"] == "ok" for s in steps), "steps": steps}
open(sys.argv[2], "w").write(json.dumps(out, indent=2) + "\n")
EOF
}

export MODE PY WHEELS OUTDIR WORK REPO BUDGET
export -f env_check install pytest_gpu equality fastpath sweep report

step env 30 env_check
step install 90 install
step pytest 120 pytest_gpu
step sweep 200 sweep
step report 60 report
step fastpath 120 fastpath
step equality 60 equality
pack

echo "=== done in $(( $(date +%s) - START ))s; outputs in $OUTDIR:"
ls -la "$OUTDIR"
RC=0
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED steps: ${FAILED[*]}"
  RC=1
else
  echo "all steps ok"
fi
exec 1>&3 2>&4 3>&- 4>&-  # close the pipe to tee and let it finish the log
wait "$TEE_PID" 2>/dev/null
exit $RC
