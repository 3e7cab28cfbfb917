"""Time dynamo's guard checks of a compiled StaticLM step directly: the full guard tree and the diff-guard tree that
`skip_guard_eval_unsafe` runs, with inductor's default config and with `use_recursive_dict_tags_for_guards`."""

import statistics
import sys
import time

import torch
import torch._dynamo.config as dyn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from specbench.config import DraftConfig, PairConfig
from specbench.decoding.static_kv import StaticLM
from specbench.models.pair import load_pair

torch.set_num_threads(2)
which, k = sys.argv[1], int(sys.argv[2])
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind="w8a16"))
model = pair.draft_model if which == "draft" else pair.target
for name, flag in (("default", False), ("dict_tags", True)):
    dyn.use_recursive_dict_tags_for_guards = flag
    lm = StaticLM(model, 640, compile_mode="max-autotune")
    lm.warm_up(1, [k])
    lm.prefill([list(range(100, 400))])
    fwd = lm._forward
    code = fwd._torchdynamo_orig_callable.__func__.__code__
    entries = _debug_get_cache_entry_list(code)
    with torch.inference_mode():
        tokens = torch.zeros(1, k, dtype=torch.long)
        positions = torch.tensor([[300 + i for i in range(k)]])
        columns = lm._columns_to(300 + k)
        fwd(tokens, positions, columns)
        f_locals = {"self": lm, "tokens": tokens, "positions": positions, "columns": columns}
        for e in entries:
            gm = e.guard_manager
            roots = {"full": gm.root, "diff": gm.diff_guard_root}
            for rname, root in roots.items():
                if root is None:
                    print(name, rname, "none")
                    continue
                ok = root.check(f_locals)
                ts = []
                for _ in range(7):
                    t = time.perf_counter()
                    for _ in range(200):
                        root.check(f_locals)
                    ts.append((time.perf_counter() - t) / 200)
                print(
                    f"{which} k={k} {name}: {rname} guards pass={ok}: {1e6 * statistics.median(ts):.1f} us [{1e6 * min(ts):.1f}, {1e6 * max(ts):.1f}]",
                    flush=True,
                )
