"""Side by side in one process: the compiled k = 1 step with the one-query kernel for bf16 (new) and with inductor's
fused attention for bf16 (old: the kernel's predicate limited to float32, as before), alternated block by block.

    python analysis/fast_path_one_query_attention_bf16_cpu_amx/ab_interleaved.py --model target|draft [--draft w8a16] [--rounds 12] [--steps 16] [--prompt-tokens 300]
"""
import argparse, statistics, time
import torch
import specbench.decoding.attention as att
from specbench.config import DraftConfig, PairConfig
from specbench.decoding.forward import ForwardPath
from specbench.models.pair import load_pair
from specbench.bench.envinfo import hardware_label

ap = argparse.ArgumentParser()
ap.add_argument("--model", choices=("draft", "target"), default="target")
ap.add_argument("--draft", default="w8a16")
ap.add_argument("--rounds", type=int, default=12)
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--prompt-tokens", type=int, default=300)
args = ap.parse_args()
torch.set_num_threads(2)
pair = load_pair(PairConfig(dtype="bfloat16"), DraftConfig(kind=args.draft))
model = pair.draft_model if args.model == "draft" else pair.target
need = args.prompt_tokens + args.steps + 2
new_pred = att.one_query_kernel
lms = {}
for name, cap in (("old", need), ("new", need + 1)):
    att.one_query_kernel = (lambda q, k, v, m, d: q.dtype == torch.float32 and new_pred(q, k, v, m, d)) if name == "old" else new_pred
    fast = ForwardPath("compiled", "max-autotune", cap)
    print(name, "compile s", round(fast.warm_up(model, 1, [1]), 1), flush=True)
    lms[name] = fast.lm(model)
att.one_query_kernel = new_pred
x = torch.zeros(1, 1, dtype=torch.long)
prompt = [list(range(100, 100 + args.prompt_tokens))]

def block(lm):
    lm.prefill(prompt)
    with torch.inference_mode():
        lm.feed(x)
        t = time.perf_counter()
        for _ in range(args.steps):
            lm.feed(x)
    return (time.perf_counter() - t) / args.steps

from torch.profiler import ProfilerActivity, profile
for name, lm in lms.items():  # each graph attends as its name says
    lm.prefill(prompt)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        lm.feed(x)
    assert any("one_query_attention" in e.name for e in prof.events()) == (name == "new"), name

times = {"old": [], "new": []}
for r in range(args.rounds):
    order = ("old", "new") if r % 2 == 0 else ("new", "old")
    for name in order:
        times[name].append(block(lms[name]))
ratios = sorted(n / o for n, o in zip(times["new"], times["old"]))
print(f"{hardware_label('cpu')}, 2 threads, {args.model} ({args.draft if args.model == 'draft' else 'bf16'}), k = 1, "
      f"{args.prompt_tokens}-token prompt, {args.rounds} rounds x {args.steps} steps, alternated")
for name in ("old", "new"):
    ts = sorted(times[name])
    print(f"{name}: median {statistics.median(ts)*1e3:.2f} ms (range {ts[0]*1e3:.2f}-{ts[-1]*1e3:.2f})")
print(f"new / old per round: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}; "
      f"quartiles {ratios[len(ratios)//4]:.3f}-{ratios[(3*len(ratios))//4]:.3f})")
