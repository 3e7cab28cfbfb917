"""Once per job, the costs of the torch engines' target and draft: C_t(k) of the target forward at the
job's batch size, and the weight-streaming floor beside both models' weight bytes (the protocol's rows;
`specbench.bench.protocol`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from specbench.bench.microbench import bench_target_forward, bench_weight_stream, streamed_weights, tensor_bytes
from specbench.decoding.forward import target_ks
from specbench.models.pair import Pair

if TYPE_CHECKING:  # annotations only: config reads the engines registry, whose engines time their costs here
    from specbench.config import Config

CT_KEYS = ("hardware", "dtype", "forward", "target", "pair", "shape_only")  # what the cost model matches C_t(k) rows on


def bench_ct(cfg: Config, pair: Pair, keys: dict, prompts: list, ks: range) -> pd.DataFrame:
    """C_t(k) rows at the job's batch size and the prompts' mean length, labelled with `CT_KEYS`."""
    context = int(sum(len(p.ids) for p in prompts) / max(1, len(prompts)))
    if pair.forward.mode is not None:  # only the shapes the job compiled: a new k would compile here
        ks = target_ks(cfg.gamma)
    lm = pair.target_lm()
    ct = pd.DataFrame(bench_target_forward(pair.target, cfg.batch_size, ks, context, seed=cfg.seed, lm=lm))
    for k in CT_KEYS:
        ct[k] = keys[k]
    return ct


def bench_floor(pair: Pair, keys: dict) -> pd.DataFrame:
    """Streaming-bandwidth probe rows with the target's and the draft's weight bytes (the hardware
    floor of a decode step: `specbench.analysis.floor.hardware_limit`), labelled with `CT_KEYS` + draft."""
    own = {"target": streamed_weights(pair.target), "draft": streamed_weights(pair.draft_model)}
    floor = pd.DataFrame(bench_weight_stream(pair.target.dtype, pair.target.device, weights=own))
    floor["target_weight_bytes"] = tensor_bytes(own["target"])
    floor["draft_weight_bytes"] = tensor_bytes(own["draft"])
    for k in (*CT_KEYS, "draft"):
        floor[k] = keys[k]
    return floor


def torch_costs(cfg: Config, pair: Pair, keys: dict, prompts: list, ks: range) -> dict[str, pd.DataFrame]:
    """The torch engines' cost tables of one job: {"ct": C_t(k) rows, "floor": the floor probe's rows}."""
    return {"ct": bench_ct(cfg, pair, keys, prompts, ks), "floor": bench_floor(pair, keys)}
