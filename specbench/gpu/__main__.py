"""python -m specbench.gpu {equality,ct,fastpath,summary} ...: the device check's steps (scripts/gpu_check.sh)."""

from __future__ import annotations

import argparse
import sys

import torch

from specbench.config.components import COMPILE_MODES
from specbench.gpu import ct, equality, fastpath, summary


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specbench.gpu", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("equality", help="greedy equality: speculative vs autoregressive, per dtype")
    e.add_argument("--device", default=_device())
    e.add_argument("--shape", default="llama-3.2-1b", help="shape preset of the target (and of its perturbed draft)")
    e.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (smaller = faster)")
    e.add_argument(
        "--init-range", type=float, default=None, help="override initializer_range (larger: peakier p, fewer ties)"
    )
    e.add_argument("--noise", type=float, default=0.05, help="draft = target + noise * std (per tensor)")
    e.add_argument("--dtypes", default="float32,bfloat16")
    e.add_argument("--gammas", type=_ints, default=[1, 4])
    e.add_argument("--batch", type=int, default=4)
    e.add_argument("--prompt-tokens", type=int, default=24)
    e.add_argument("--new-tokens", type=int, default=32)
    e.add_argument("--out", default=None, help="JSON results")
    c = sub.add_parser("ct", help="C_t(k) micro-benchmark of the target forward")
    c.add_argument("--device", default=_device())
    c.add_argument("--shape", default="llama-3.1-8b")
    c.add_argument("--layers", type=int, default=None)
    c.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    c.add_argument("--batch-sizes", type=_ints, default=[1, 4, 16, 64])
    c.add_argument("--k-max", type=int, default=16)
    c.add_argument("--context", type=int, default=144, help="context length (prompt + about half the output)")
    c.add_argument("--repeats", type=int, default=5)
    c.add_argument("--out", required=True, help=".parquet or .csv")
    f = sub.add_parser("fastpath", help="the compiled fast path against eager, side by side")
    f.add_argument("--device", default=_device())
    f.add_argument("--target-shape", default="llama-3.1-8b")
    f.add_argument("--draft-shape", default="llama-3.2-1b")
    f.add_argument("--layers", type=int, default=None, help="override num_hidden_layers of both (smaller = faster)")
    f.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    f.add_argument("--batch-sizes", type=_ints, default=[1, 16])
    f.add_argument("--gamma", type=int, default=4)
    f.add_argument("--new-tokens", type=int, default=32)
    f.add_argument("--prompt-tokens", type=int, default=64)
    f.add_argument("--repeats", type=int, default=3)
    f.add_argument(
        "--compile-mode",
        default="reduce-overhead",
        choices=[*COMPILE_MODES, "none"],
        help="torch.compile mode of the fast path (CUDA graphs: reduce-overhead); none: static, uncompiled",
    )
    f.add_argument("--out", required=True, help="JSON results")
    m = sub.add_parser("summary", help="per job of a device-check sweep: C_o share, host syncs, energy per token")
    m.add_argument("sweep_dir")
    m.add_argument(
        "--alphas",
        type=lambda t: [float(x) for x in t.split(",") if x],
        default=[0.6, 0.7, 0.8, 0.9],
        help="acceptance rates to solve the cost model's optimal γ per batch size at (shape-only models accept nothing)",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    torch.manual_seed(0)
    return {"equality": equality.run, "ct": ct.run, "fastpath": fastpath.run, "summary": summary.run}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
