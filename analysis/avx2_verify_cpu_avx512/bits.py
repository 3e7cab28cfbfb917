"""The AVX2 bf16 kernel's outputs over 64 cases (K 64/576/1536/100, 1-8 rows, bf16 and float32 activations), saved,
to compare two builds bit for bit:

    ATEN_CPU_CAPABILITY=avx2 python analysis/avx2_verify_cpu_avx512/bits.py new.pt        # this checkout
    (cd OLD && PYTHONPATH=OLD ATEN_CPU_CAPABILITY=avx2 python .../bits.py old.pt)       # the other, its own build
    python analysis/avx2_verify_cpu_avx512/bits.py --compare new.pt old.pt
"""

import sys

import torch

CASES = [(K, R, dt) for K in (64, 576, 1536, 100) for R in range(1, 9) for dt in ("bfloat16", "float32")]


def outputs() -> list[torch.Tensor]:
    from specbench.models import cpu_bf16

    torch.manual_seed(0)
    isa = {name: isa for isa, name in cpu_bf16.ISA_NAMES.items()}["avx2"]
    out, weights = [], {}
    for K, R, dt in CASES:
        w = weights.setdefault(K, torch.randn(96, K, dtype=torch.bfloat16))
        out.append(cpu_bf16.bf16_matvec(torch.randn(R, K, dtype=getattr(torch, dt)), w, None, isa))
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        differ = [case for case, x, y in zip(CASES, a, b) if not torch.equal(x, y)]
        print(f"{len(CASES) - len(differ)} of {len(CASES)} cases bit for bit equal; differ: {differ}")
    else:
        torch.save(outputs(), sys.argv[1])
