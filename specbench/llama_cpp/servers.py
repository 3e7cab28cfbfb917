"""The llama-servers of one job: llama.cpp's plain decoder and its speculative decoder at the
job's γ, each started once per job when its engine opens (models load once), used for every
measured request, stopped when it closes (`specbench.engines.llama_cpp`). Both share the binary,
the target GGUF, the thread count and the front end."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from specbench.decoding.decoder import DecodeResult
from specbench.llama_cpp.binaries import find_tool
from specbench.llama_cpp.costs import bench_costs
from specbench.llama_cpp.decoder import llama_cpp_decode
from specbench.llama_cpp.ggufs import gguf_path
from specbench.llama_cpp.server import LlamaServer, ServerSpec

if TYPE_CHECKING:
    from specbench.config import Config  # annotations only: config reads the engines registry, which names this module


def llama_threads(cfg: Config) -> int:
    """llama.cpp's threads: llama_cpp.threads, else the job's threads, else the usable cores."""
    return cfg.llama_cpp.threads or cfg.threads or len(os.sched_getaffinity(0))


def check_binaries(cfg: Config) -> None:
    """Before any model loads: the binaries a llama.cpp job runs (`LlamaCppMissing` names the missing
    one, where it was looked for and the build command)."""
    for tool in ("llama-server", "llama-bench"):
        find_tool(tool, cfg.llama_cpp.bin_dir)


def _common(cfg: Config) -> dict:
    lc = cfg.llama_cpp
    cache = Path(cfg.pair.cache_dir) if cfg.pair.cache_dir else None
    return dict(
        target=gguf_path(lc.target, cache, lc.bin_dir),
        threads=llama_threads(cfg),
        ctx_size=lc.ctx_size,
        port=lc.port,
        startup_timeout=float(lc.startup_timeout),
        bin_dir=lc.bin_dir,
    )


def plain_spec(cfg: Config) -> ServerSpec:
    """How llama.cpp's plain decoder's server starts."""
    return ServerSpec(**_common(cfg))


def speculative_spec(cfg: Config) -> ServerSpec:
    """How llama.cpp's speculative decoder's server starts, at the job's γ and llama_cpp settings."""
    lc = cfg.llama_cpp
    cache = Path(cfg.pair.cache_dir) if cfg.pair.cache_dir else None
    # n-gram lookup lengths like specbench's own n-gram draft (llama.cpp's default, 12, rarely matches a chat)
    ngram = dict(spec_type=lc.draft, ngram_size=cfg.draft.max_ngram)
    draft = ngram if lc.draft_is_ngram else dict(draft=gguf_path(lc.draft, cache, lc.bin_dir))
    return ServerSpec(
        **_common(cfg),
        **draft,
        draft_max=max(1, cfg.gamma),
        draft_min=lc.draft_min,
        draft_p_min=float(lc.draft_p_min),
        draft_sampling=lc.draft_sampling,
    )


class ServerSession:
    """One running llama-server as an engine session. A fixed port serves one server at a time, so with
    llama_cpp.port set the job's servers take port + slot."""

    def __init__(self, spec: ServerSpec, cfg: Config, slot: int) -> None:
        if spec.port:
            spec = dataclasses.replace(spec, port=spec.port + slot)
        self.sampling = cfg.sampling.build()
        self.server = LlamaServer(spec)
        self.server.start()

    def decode(self, ids: list[list[int]], seed: int, max_new_tokens: int) -> DecodeResult:
        return llama_cpp_decode(self.server, ids, self.sampling, max_new_tokens, seed)

    def close(self) -> None:
        self.server.stop()


def bench_llama_ct(cfg: Config, keys: dict, prompts: list, ks: range) -> pd.DataFrame:
    """llama.cpp's own costs at the prompts' mean length (`costs.bench_costs`) for the models of the
    job's servers, labelled like the job's llama.cpp rows (hardware, target, pair, GGUF dtype, draft)."""
    lc = cfg.llama_cpp
    spec = speculative_spec(cfg)
    depth = int(sum(len(p.ids) for p in prompts) / max(1, len(prompts)))
    rows = bench_costs(
        str(spec.target),
        lc.target,
        str(spec.draft) if spec.draft else None,
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
