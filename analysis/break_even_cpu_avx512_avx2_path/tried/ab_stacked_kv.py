"""In one process: a StaticLM whose cache has one tensor per layer and K/V (as before) vs the stacked one, alternated.
Runs on a checkout with stacked_kv.patch applied (its `RowCache` is the stacked one; `PerLayer` rebuilds the old).

    git apply stacked_kv.patch && python ab_stacked_kv.py draft|target 1
"""

import statistics
import sys
import time

import torch

from specbench.config import DraftConfig, PairConfig
from specbench.decoding.static_kv import RowCache, StaticLM
from specbench.models.pair import load_pair

torch.set_num_threads(2)
which, k = sys.argv[1], int(sys.argv[2])


class PerLayer(RowCache):
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        at = self.write_at
        rows = torch.arange(at.shape[0], device=at.device)[:, None]
        layer.keys[rows, :, at] = key_states.transpose(1, 2)
        layer.values[rows, :, at] = value_states.transpose(1, 2)
        n = self.visible
        return layer.keys[:, :, :n], layer.values[:, :, :n]


pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.draft_model if which == "draft" else pair.target
lms = {}
for name in ("old", "new"):
    lm = StaticLM(model, 640, compile_mode="max-autotune")
    if name == "old":
        layers = lm.cache.layers
        lm.cache = PerLayer(len(layers))
        lm.prefill([[0]])
        for layer in lm.cache.layers:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
    print(name, "compile", lm.warm_up(1, [k]), flush=True)
    lms[name] = lm
x = torch.zeros(1, k, dtype=torch.long)


def blk(lm, n=32):
    lm.prefill([list(range(100, 400))])
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(n):
            lm.feed(x)
    return (time.perf_counter() - t) / n


ts = {"old": [], "new": []}
for r in range(12):
    for name in ("old", "new") if r % 2 else ("new", "old"):
        ts[name].append(blk(lms[name]))
ratios = sorted(n / o for n, o in zip(ts["new"], ts["old"]))
print(
    f"{which} k={k}: old {1e3 * statistics.median(ts['old']):.3f} ms, new {1e3 * statistics.median(ts['new']):.3f} ms; new/old median {statistics.median(ratios):.3f} range {ratios[0]:.3f}-{ratios[-1]:.3f}"
)
o, n = lms["old"], lms["new"]
o.prefill([list(range(100, 400))])
n.prefill([list(range(100, 400))])
with torch.inference_mode():
    a = o.feed(torch.tensor([[7] * k]))
    b = n.feed(torch.tensor([[7] * k]))
print(
    "same logits:",
    torch.equal(a, b),
    "same kv:",
    all(torch.equal(l1.keys, l2.keys) for l1, l2 in zip(o.cache.layers, n.cache.layers)),
)
