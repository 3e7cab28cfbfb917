# Alternate processes of fma_probe.py between two checkouts, each with its own extension build:
#   ATEN_CPU_CAPABILITY=avx2 bash analysis/engines_w8a16_cpu_avx2_path/ab.sh <old checkout> <new checkout> [rounds]
# (run from the project's environment; each checkout needs analysis/engines_w8a16_cpu_avx2_path/fma_probe.py)
set -e
OLD=${1:?old checkout} NEW=${2:?new checkout} ROUNDS=${3:-3}
EXT=$(mktemp -d)
for i in $(seq "$ROUNDS"); do
  for side in old new; do
    if [ $side = old ]; then D=$OLD; else D=$NEW; fi
    echo "== round $i $side"
    (cd "$D" && PYTHONPATH="$D" TORCH_EXTENSIONS_DIR="$EXT/$side" python analysis/engines_w8a16_cpu_avx2_path/fma_probe.py --rounds 9 | tail -6)
  done
done
