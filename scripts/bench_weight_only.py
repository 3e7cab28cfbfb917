"""One decode-step matvec per weight shape of the embedded target: bf16 (ATen's gemv) vs torch's int8 and
int4 weight-only CPU kernels, as the W8A16 and W4A16 drafts run them.

    python scripts/bench_weight_only.py [--threads 1] [--rows 1]

Each layer is timed over copies of its weight that add up to 48 MiB, so the weights stream from memory
as in a decode step, and the three kernels are timed in turn (`interleaved_medians`). A quantized draft
is only cheap where its kernel beats the gemv by about its byte ratio (2× int8, 4× int4): the ratio
column says by how much it does. Prints a markdown table with the machine's ISA.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from specbench.bench.envinfo import environment_record, hardware_label
from specbench.models.kernels import PROBE_BYTES, aten_gemv, interleaved_medians
from specbench.models.quant import Int4Linear, Int8Linear

SHAPES = {  # SmolLM2-135M: (out, in) and how many per forward
    "q / o proj": ((576, 576), 60),
    "k / v proj": ((192, 576), 60),
    "gate / up proj": ((1536, 576), 60),
    "down proj": ((576, 1536), 30),
    "lm_head": ((49152, 576), 1),
    "lm_head, top 16384": ((16384, 576), 1),
}


def time_shape(n: int, k: int, rows: int, repeats: int) -> tuple[dict[str, float], int]:
    """Seconds per kernel over every streamed copy of one [n, k] weight, and the number of copies."""
    copies = max(2, min(256, PROBE_BYTES // (n * k * 2)))
    linears = [nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for _ in range(copies)]
    int8 = [Int8Linear(m, probe=False) for m in linears]
    int4 = [Int4Linear(m, probe=False) for m in linears]
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    runs = {
        "bf16": lambda: [aten_gemv(x, m.weight) for m in linears],
        "int8": lambda: [m.kernel(x) for m in int8],
        "int4": lambda: [m.kernel(x) for m in int4],
    }
    return interleaved_medians(runs, repeats), copies


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = environment_record()
    print(
        f"hardware `{hardware_label('cpu')}`, ISA flags {env['cpu']['isa']['flags']}, torch kernels "
        f"{env['cpu']['isa']['torch_capability']}, {args.threads} thread(s), {args.rows} row(s)\n"
    )
    print("| layer | bf16 gemv µs | int8 µs (gemv / int8) | int4 µs (gemv / int4) |")
    print("|---|---|---|---|")
    totals = {"bf16": 0.0, "int8": 0.0, "int4": 0.0}
    with torch.inference_mode():
        for name, ((n, k), per_forward) in SHAPES.items():
            t, copies = time_shape(n, k, args.rows, args.repeats)
            us = {kind: t[kind] / copies * 1e6 for kind in t}
            if not name.startswith("lm_head, top"):
                for kind in totals:
                    totals[kind] += us[kind] * per_forward
            print(
                f"| {name} {n}x{k} | {us['bf16']:.0f} | {us['int8']:.0f} ({us['bf16'] / us['int8']:.2f}×) | "
                f"{us['int4']:.0f} ({us['bf16'] / us['int4']:.2f}×) |"
            )
    print(
        f"\nA forward's linears (whole head): bf16 {totals['bf16'] / 1e3:.1f} ms, int8 {totals['int8'] / 1e3:.1f} ms, "
        f"int4 {totals['int4'] / 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
