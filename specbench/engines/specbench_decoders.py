"""specbench's own engines: the speculative decoder and its autoregressive baseline, on the pair's
models and the job's forward path (`specbench.decoding.decoder`)."""

from __future__ import annotations

from specbench.decoding.records import AUTOREGRESSIVE, SPECULATIVE
from specbench.engines.base import TORCH, Engine, TorchSession, register


def torch_costs(cfg, pair, keys, prompts, ks) -> dict:
    from specbench.bench.costs import torch_costs as costs

    return costs(cfg, pair, keys, prompts, ks)


def _generator_and_timer(pair, seed: int):
    import torch

    from specbench.decoding.timing import PhaseTimer

    return torch.Generator(device=pair.target.device).manual_seed(seed), PhaseTimer(pair.target.device)


def open_autoregressive(cfg, pair, slot: int) -> TorchSession:
    from specbench.decoding.decoder import autoregressive_decode

    sampling = cfg.sampling.build()

    def decode(ids, seed, max_new_tokens):
        generator, timer = _generator_and_timer(pair, seed)
        return autoregressive_decode(pair.target_lm(), ids, sampling, max_new_tokens, pair.eos, generator, timer)

    return TorchSession(decode)


def open_speculative(cfg, pair, slot: int) -> TorchSession:
    from specbench.decoding.decoder import speculative_decode
    from specbench.decoding.policies import POLICIES

    sampling = cfg.sampling.build()
    policy = POLICIES.get(cfg.draft.policy, "draft.policy")

    def decode(ids, seed, max_new_tokens):
        generator, timer = _generator_and_timer(pair, seed)
        lm, draft = pair.target_lm(), pair.new_draft()
        return speculative_decode(
            lm,
            draft,
            ids,
            cfg.gamma,
            sampling,
            max_new_tokens,
            pair.eos,
            generator,
            timer,
            policy=policy,
            tau=cfg.draft.tau,
        )

    return TorchSession(decode)


register(
    Engine(
        AUTOREGRESSIVE,
        baseline=AUTOREGRESSIVE,
        runtime=TORCH,
        open=open_autoregressive,
        description="specbench's plain decoding: one target step per token, on the job's forward path",
        costs=torch_costs,
    )
)
register(
    Engine(
        SPECULATIVE,
        baseline=AUTOREGRESSIVE,
        runtime=TORCH,
        open=open_speculative,
        description="specbench's speculative decoder: the job's draft and policy, γ = gamma",
        costs=torch_costs,
    )
)
