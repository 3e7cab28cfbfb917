"""llama.cpp's decoders under audit: each continuation is one request to a running llama-server
(prompt cache on: only the output distribution is audited, not timing), and the reference is
llama.cpp's own plain decoding of the same GGUF target, since its numerics (F16 weights, its
kernels) are not the torch target's.

Names: `llama_cpp` (llama.cpp's default: argmax draft, accept while the target's sample matches),
`llama_cpp:probabilistic` (a sampled draft verified by rejection sampling; `@<p>` adds `--spec-draft-p-min p`,
llama.cpp's own draft-length policy: stop drafting when the draft's top probability is below p), and
`llama_cpp_autoregressive` (plain decoding, the reference; audited against itself it must pass).
"""

from __future__ import annotations

from contextlib import ExitStack

from specbench.audit.decoders import DecoderUnderTest, pad_rows
from specbench.audit.names import is_llama_cpp, llama_cpp_p_min
from specbench.audit.settings import derive_seed
from specbench.decoding.sampling import SamplingConfig
from specbench.llama_cpp.decoder import request_params
from specbench.llama_cpp.ggufs import gguf_path
from specbench.llama_cpp.server import LlamaServer, ServerSpec

REFERENCE = "llama_cpp_autoregressive"


def server_decoder(name: str, server: LlamaServer, sampling: SamplingConfig, gamma: int | None) -> DecoderUnderTest:
    """A DecoderUnderTest whose continuations are requests to `server`, one seed each."""

    def sample(prompt, n, tokens, seed):
        rows = []
        for i in range(n):
            params = request_params(sampling, derive_seed(seed, i))
            rows.append(server.complete(list(prompt), params, tokens).tokens)
        return pad_rows(rows, tokens)

    return DecoderUnderTest(name, sample, gamma, first_speculative_token=2 if gamma else 0)


class LlamaCppAudit(ExitStack):
    """`with LlamaCppAudit(names, gamma, target_type, draft_type, threads) as la:` la.decoder(name,
    sampling) and la.reference(sampling); one server per name (and one for the reference)."""

    def __init__(self, names, gamma: int, target: str = "F16", draft: str = "Q4_1", threads: int = 1) -> None:
        super().__init__()
        unknown = [n for n in names if not is_llama_cpp(n)]
        if unknown:
            raise ValueError(
                f"audit.decoder={unknown[0]!r}: llama.cpp decoders are llama_cpp, llama_cpp:probabilistic[@p_min], "
                f"{REFERENCE}"
            )
        self.names, self.gamma = list(dict.fromkeys([*names, REFERENCE])), gamma
        self.target, self.draft, self.threads = target, draft, threads
        self.servers: dict[str, LlamaServer] = {}

    def __enter__(self) -> LlamaCppAudit:
        super().__enter__()
        common = dict(target=gguf_path(self.target), threads=self.threads, cache_prompt=True)
        try:
            for name in self.names:
                if name == REFERENCE:
                    spec = ServerSpec(**common)
                else:
                    sampling = "probabilistic" if name.startswith("llama_cpp:probabilistic") else "greedy"
                    spec = ServerSpec(
                        **common,
                        draft=gguf_path(self.draft),
                        draft_max=self.gamma,
                        draft_sampling=sampling,
                        draft_p_min=llama_cpp_p_min(name),  # llama.cpp's own draft-length policy, when named
                    )
                self.servers[name] = self.enter_context(LlamaServer(spec))
        except BaseException:
            self.close()
            raise
        return self

    def decoder(self, name: str, sampling: SamplingConfig) -> DecoderUnderTest:
        return server_decoder(name, self.servers[name], sampling, None if name == REFERENCE else self.gamma)

    def reference(self, sampling: SamplingConfig) -> DecoderUnderTest:
        return self.decoder(REFERENCE, sampling)
