"""llama.cpp's engines, each a llama-server the job starts when it opens the engine and stops when it
closes it (`specbench.llama_cpp.servers`): plain decoding, and speculative decoding with the GGUF draft
(or n-gram lookup) at the job's γ. GGUF copies of the embedded pair, batch size 1."""

from __future__ import annotations

from specbench.decoding.records import LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE
from specbench.engines.base import SERVER, Engine, register


def open_plain(cfg, pair, slot: int):
    from specbench.llama_cpp.servers import ServerSession, plain_spec

    return ServerSession(plain_spec(cfg), cfg, slot)


def open_speculative(cfg, pair, slot: int):
    from specbench.llama_cpp.servers import ServerSession, speculative_spec

    return ServerSession(speculative_spec(cfg), cfg, slot)


def check(cfg) -> None:
    """What a llama.cpp job needs of the config: the embedded pair (its GGUF copies), llama.cpp's samplers."""
    from specbench.llama_cpp.options import check_sampling

    if cfg.pair.target.source != "embedded" or cfg.pair.target.shape:
        raise ValueError(
            f"pair.target.source={cfg.pair.target.source!r}: decoder='llama_cpp' runs GGUF copies of the "
            "embedded model; use pair=embedded"
        )
    check_sampling(cfg.sampling.build())


def preflight(cfg) -> None:
    from specbench.llama_cpp.servers import check_binaries

    check_binaries(cfg)


def plain_keys(cfg) -> dict:
    """llama.cpp's rows name its GGUF type, not the torch pair's dtype."""
    return {"dtype": cfg.llama_cpp.row_dtype}


def speculative_keys(cfg) -> dict:
    lc = cfg.llama_cpp
    # draft_kind: the DRAFT_KINDS name of what llama.cpp drafts with (a model, or n-gram lookup)
    return plain_keys(cfg) | {"draft": lc.row_draft, "draft_kind": "ngram" if lc.draft_is_ngram else "model"}


def llama_costs(cfg, pair, keys, prompts, ks) -> dict:
    from specbench.llama_cpp.servers import bench_llama_ct

    return {"llama_ct": bench_llama_ct(cfg, keys, prompts, ks)}


_COMMON = dict(
    runtime=SERVER,
    batch_one=True,
    timed_rounds=False,  # llama-server logs each round's counts, not its times: llama-bench's rows instead
    tunable=False,
    check=check,
    preflight=preflight,
    costs=llama_costs,
)
register(
    Engine(
        LLAMA_CPP_AUTOREGRESSIVE,
        baseline=LLAMA_CPP_AUTOREGRESSIVE,
        open=open_plain,
        description="llama.cpp's plain decoding: llama-server with the target GGUF alone",
        row_keys=plain_keys,
        **_COMMON,
    )
)
register(
    Engine(
        LLAMA_CPP,
        baseline=LLAMA_CPP_AUTOREGRESSIVE,
        open=open_speculative,
        description="llama.cpp's speculative decoding: llama-server with the draft GGUF (or n-gram lookup), γ = gamma",
        row_keys=speculative_keys,
        **_COMMON,
    )
)
