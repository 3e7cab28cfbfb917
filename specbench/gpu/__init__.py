"""The device check's Python side (`python -m specbench.gpu {equality,ct,fastpath}`); `scripts/gpu_check.sh` runs
it step by step on a GPU machine, or on CPU with tiny shapes (`--cpu-smoke`). See docs/gpu.md."""
