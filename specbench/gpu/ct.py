"""The C_t(k) micro-benchmark standalone (`python -m specbench.gpu ct`): `specbench.bench.microbench`, which every
job also runs at its own batch size and context, for a shape-only target at any batch sizes and context. Writes
the table `python -m specbench.report --ct` and `specbench.analysis.timing.TimingProfile` read (hardware, dtype,
target, batch_size, k, context_len, t_forward seconds, repeat).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbench.bench.envinfo import hardware_label
from specbench.models.loading import DTYPES
from specbench.models.shapes import build_shape_only_model, shape_config


@torch.inference_mode()
def ct_bench(
    shape: str,
    dtype: torch.dtype,
    device: torch.device,
    batch_sizes: list[int],
    ks: list[int],
    context_len: int,
    repeats: int,
    layers: int | None = None,
    seed: int = 0,
):
    """`specbench.microbench.bench_target_forward` on a shape-only target, per batch size,
    with the keys the cost model matches on (what a job's own ct.parquet holds)."""
    import pandas as pd

    from specbench.bench.microbench import bench_target_forward

    config = shape_config(shape, **({"num_hidden_layers": layers} if layers else {}))
    model = build_shape_only_model(config, dtype=dtype, device=device, seed=seed)
    rows = []
    for batch in batch_sizes:
        rows += bench_target_forward(model, batch, ks, context_len=context_len, repeats=repeats, seed=seed)
        print(
            f"  batch {batch}: C_t(1) {_median(rows, batch, ks[0]) * 1e3:.2f} ms, "
            f"C_t({ks[-1]}) {_median(rows, batch, ks[-1]) * 1e3:.2f} ms",
            flush=True,
        )
    df = pd.DataFrame(rows)
    df.insert(0, "hardware", hardware_label(device))
    df.insert(1, "dtype", str(dtype).removeprefix("torch."))
    df.insert(2, "target", shape)
    df["shape_only"] = True
    return df


def _median(rows, batch, k) -> float:
    ts = sorted(r["t_forward"] for r in rows if r["batch_size"] == batch and r["k"] == k)
    return ts[len(ts) // 2]


def run(args) -> int:
    df = ct_bench(
        args.shape,
        DTYPES[args.dtype],
        torch.device(args.device),
        args.batch_sizes,
        list(range(1, args.k_max + 1)),
        args.context,
        args.repeats,
        args.layers,
    )
    out = Path(args.out)
    df.to_parquet(out, index=False) if out.suffix == ".parquet" else df.to_csv(out, index=False)
    print(f"wrote {out}: {len(df)} rows")
    return 0
