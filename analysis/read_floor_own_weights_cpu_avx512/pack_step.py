"""A first try at one arena: the target's parameters and buffers copied end to end into one fresh allocation (64-byte
aligned, tied tensors once) before the compile, against the model as loaded; the compiled step's median time at
k = 1 and 5 (7 blocks of 16 steps after a 300-token prompt), 2 threads. Not the fused q/k/v and gate/up copies,
which the compile makes afterwards.

    for i in 1 2; do python analysis/read_floor_own_weights_cpu_avx512/pack_step.py nopack
      python analysis/read_floor_own_weights_cpu_avx512/pack_step.py pack; done
"""

import sys
import time

import torch

from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair

torch.set_num_threads(2)
pack = sys.argv[1] == "pack"
which = sys.argv[2] if len(sys.argv) > 2 else "target"
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.target if which == "target" else pair.draft_model


def pack_weights(model):
    seen = {}
    items = []
    for mod in model.modules():
        for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            if t is None:
                continue
            items.append((mod, name, t, t.data_ptr()))
            seen.setdefault(t.data_ptr(), t)
    sizes = {p: (t.numel() * t.element_size() + 63) // 64 * 64 for p, t in seen.items()}
    arena = torch.empty(sum(sizes.values()), dtype=torch.uint8)
    views, at = {}, 0
    for p, t in seen.items():
        n = t.numel() * t.element_size()
        v = arena[at : at + n].view(t.dtype).view(t.shape)
        v.copy_(t)
        views[p] = v
        at += sizes[p]
    for mod, name, _t, ptr in items:
        v = views[ptr]
        if name in mod._parameters:
            mod._parameters[name].data = v
        else:
            mod._buffers[name] = v
    return arena


if pack:
    keep = pack_weights(model)
fast = ForwardPath("compiled", "max-autotune", 300 + 400)
fast.warm_up(model, 1, [1, 5])
lm = fast.lm(model)
out = []
for k in (1, 5):
    x = torch.zeros(1, k, dtype=torch.long)

    def steps(n, x=x):
        lm.prefill([list(range(100, 400))])
        with torch.inference_mode():
            lm.feed(x)
            t0 = time.perf_counter()
            for _ in range(n):
                lm.feed(x)
        return (time.perf_counter() - t0) / n * 1e3

    ts = sorted(steps(16) for _ in range(7))
    out.append(f"k={k} {ts[3]:.2f} ms [{ts[0]:.2f}, {ts[-1]:.2f}]")
print(sys.argv[1], which, *out)
