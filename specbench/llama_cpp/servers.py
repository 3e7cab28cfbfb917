"""The llama-servers of one job: llama.cpp's plain decoder and its speculative decoder at the
job's γ, started once per job (models load once), used for every measured request, stopped
at the end. Both share the binary, the target GGUF, the thread count and the front end."""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack
from pathlib import Path

import pandas as pd

from specbench.config import Config
from specbench.decoding.records import LLAMA_CPP, LLAMA_CPP_AUTOREGRESSIVE, LLAMA_CPP_DECODERS
from specbench.llama_cpp.costs import bench_costs
from specbench.llama_cpp.ggufs import gguf_path
from specbench.llama_cpp.server import LlamaServer, ServerSpec


def llama_threads(cfg: Config) -> int:
    """llama.cpp's threads: llama_cpp.threads, else the job's threads, else the usable cores."""
    return cfg.llama_cpp.threads or cfg.threads or len(os.sched_getaffinity(0))


def server_specs(cfg: Config) -> dict[str, ServerSpec]:
    """{decoder name: how its server starts} for the job's γ and llama_cpp settings."""
    lc = cfg.llama_cpp
    cache = Path(cfg.pair.cache_dir) if cfg.pair.cache_dir else None
    common = dict(
        target=gguf_path(lc.target, cache, lc.bin_dir),
        threads=llama_threads(cfg),
        ctx_size=lc.ctx_size,
        port=lc.port,
        startup_timeout=float(lc.startup_timeout),
        bin_dir=lc.bin_dir,
    )
    # n-gram lookup lengths like specbench's own n-gram draft (llama.cpp's default, 12, rarely matches a chat)
    ngram = dict(spec_type=lc.draft, ngram_size=cfg.draft.max_ngram)
    draft = ngram if lc.draft_is_ngram else dict(draft=gguf_path(lc.draft, cache, lc.bin_dir))
    return {
        LLAMA_CPP_AUTOREGRESSIVE: ServerSpec(**common),
        LLAMA_CPP: ServerSpec(
            **common,
            **draft,
            draft_max=max(1, cfg.gamma),
            draft_min=lc.draft_min,
            draft_p_min=float(lc.draft_p_min),
            draft_sampling=lc.draft_sampling,
        ),
    }


class JobServers(ExitStack):
    """`with JobServers(cfg, names) as servers: servers[name]`: one running server per llama.cpp decoder
    in `names` (none when the job has no llama.cpp decoder). A fixed port serves one server at a time,
    so with llama_cpp.port set the servers take it in turn: port + 0, port + 1."""

    def __init__(self, cfg: Config, names: list[str]) -> None:
        super().__init__()
        self.cfg = cfg
        self.names = [n for n in names if n in LLAMA_CPP_DECODERS]
        self.servers: dict[str, LlamaServer] = {}
        self.specs: dict[str, ServerSpec] = {}  # as `server_specs`, once the servers started

    def __enter__(self) -> JobServers:
        super().__enter__()
        if not self.names:
            return self
        self.specs = server_specs(self.cfg)
        try:
            for i, name in enumerate(self.names):
                spec = self.specs[name]
                if spec.port:
                    spec = dataclasses.replace(spec, port=spec.port + i)
                self.servers[name] = self.enter_context(LlamaServer(spec))
        except BaseException:
            self.close()
            raise
        return self

    def __getitem__(self, name: str) -> LlamaServer:
        if name not in self.servers:
            raise KeyError(f"no llama-server for decoder {name!r} in this job (servers: {sorted(self.servers)})")
        return self.servers[name]


def bench_llama_ct(cfg: Config, keys: dict, prompts: list, ks: range, specs: dict[str, ServerSpec]) -> pd.DataFrame:
    """llama.cpp's own costs at the prompts' mean length (`costs.bench_costs`) for the models of the
    job's servers (`specs`), labelled like the job's llama.cpp rows (hardware, target, pair, GGUF dtype, draft)."""
    lc = cfg.llama_cpp
    depth = int(sum(len(p.ids) for p in prompts) / max(1, len(prompts)))
    draft = specs[LLAMA_CPP].draft
    rows = bench_costs(
        str(specs[LLAMA_CPP].target),
        lc.target,
        str(draft) if draft else None,
        lc.draft,
        ks=ks,
        depth=depth,
        threads=llama_threads(cfg),
        bin_dir=lc.bin_dir,
    )
    for k in ("hardware", "target", "pair", "shape_only"):
        rows[k] = keys[k]
    rows["dtype"] = lc.row_dtype
    rows["batch_size"] = 1
    rows["draft"] = lc.row_draft
    return rows
