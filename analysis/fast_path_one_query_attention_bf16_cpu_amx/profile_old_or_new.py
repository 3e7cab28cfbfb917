"""scripts/profile_step.py with bf16 attention as before this change (old: specbench's one-query kernel for float32
only, inductor's fused reduction for bf16) or as now (new). From the repository root:

    python analysis/fast_path_one_query_attention_bf16_cpu_amx/profile_old_or_new.py old|new --model target --k 1 --rows 12
"""
import sys, runpy, torch
variant = sys.argv.pop(1)
if variant == "old":
    import specbench.decoding.attention as att
    new = att.one_query_kernel
    att.one_query_kernel = lambda q, k, v, m, d: q.dtype == torch.float32 and new(q, k, v, m, d)
sys.argv[0] = "scripts/profile_step.py"
runpy.run_path("scripts/profile_step.py", run_name="__main__")
