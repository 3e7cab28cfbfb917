# Alternate processes of kernel_probe.py between two checkouts, each with its own extension build:
#   bash scripts/ab_kernel.sh <old checkout> <new checkout> [rounds] [kernel_probe.py arguments...]
#   ATEN_CPU_CAPABILITY=avx2 bash scripts/ab_kernel.sh <old> <new> 3 --isa avx2
# Run from the project's environment; both sides run this checkout's scripts/kernel_probe.py on their own code.
set -e
OLD=${1:?old checkout} NEW=${2:?new checkout} ROUNDS=${3:-3}
shift $(($# < 3 ? $# : 3))
PROBE=$(cd "$(dirname "$0")" && pwd)/kernel_probe.py
EXT=$(mktemp -d)
for i in $(seq "$ROUNDS"); do
  for side in old new; do
    if [ $side = old ]; then D=$OLD; else D=$NEW; fi
    echo "== round $i $side"
    (cd "$D" && PYTHONPATH="$D" TORCH_EXTENSIONS_DIR="$EXT/$side" python "$PROBE" --rounds 9 "$@" | tail -n +2)
  done
done
