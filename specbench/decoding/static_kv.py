"""The fast path: a causal LM over a preallocated KV cache with one write position per row.

Every row keeps its committed tokens in columns 0..n-1 of a [B, kv_heads, capacity, d] buffer
per layer, so a token's position is its column and a rollback is a length change (gpt-fast's
cache, with per-row lengths since rows accept different counts): no holes, no crop, no
compaction, and every forward over k tokens has the same shapes ([B, k] in, a [B, 1, k, n] mask
over the first n columns), which is what lets `torch.compile` (inductor on CPU, CUDA graphs on GPU)
run the draft step and the verify forward without per-op Python dispatch. On CPU n is what the
rows hold, rounded up to VISIBLE_STEP, and a symbol of the compiled graph (so attention does not
cost the whole capacity and a growing row meets no new graph); on GPU it is the capacity.

`StaticLM` has `CachedLM`'s interface, so drafts and the decoder do not know which one they
hold; `CachedLM` stays the reference. Invariant (tested, as for `CachedLM`): columns 0..n-1 of a
row hold exactly its committed tokens, with the KV a fresh prefill of them gives.
The batch is fixed too: a finished row keeps its slot (its forwards are wasted work, nearly free
while a step is memory-bound), so the shapes a decode meets are (B, 1), (B, 2) and (B, γ+1); on CPU every
k ≥ 2 runs one graph (k a symbol), so a new γ compiles nothing (unless a kernel choice depends on k).
Compilation happens in `warm_up`, timed apart (`compile_seconds`); a shape first met inside a
decode is counted in `new_shapes`, so a run shows that none was compiled inside a timed phase.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from specbench.decoding.attention import GROUPED, symbolic_columns
from specbench.decoding.compile_cache import compiled_forward, concat_linears
from specbench.decoding.forward_choice import fast_path_refusal
from specbench.decoding.kvcache import attention_windows, cache_keyword, check_prefill_source, with_cache
from specbench.decoding.rotary import tabulate_rotary
from specbench.decoding.timing import to_device, to_host
from specbench.models import cpu_matvec
from specbench.models.matvec_fusion import FUSION_PASS, weights_fingerprint

ADDITIVE_MASKS = ("eager", GROUPED)  # attention implementations that add their mask to the scores
VISIBLE_STEP = 64  # a forward attends to its rows' columns rounded up to this (not to the whole capacity)


class RowLayer(CacheLayerMixin):
    """One layer's keys and values [B, kv_heads, capacity, d], written at the owner's `write_at` [B, k]."""

    is_compileable = True

    def __init__(self, owner: RowCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("RowLayer buffers are allocated by StaticLM.prefill")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # states [B, kv_heads, k, d] go to columns write_at [B, k] of their rows. An index_put, not a
        # scatter: inductor writes an index_put into the buffer in place, while a scatter became a copy
        # of the whole layer's buffer in and out on every forward (a large share of a draft step).
        at = self.owner.write_at
        rows = torch.arange(at.shape[0], device=at.device)[:, None]  # [B, 1]
        self.keys[rows, :, at] = key_states.transpose(1, 2)  # indexed [B, k, kv_heads, d]
        self.values[rows, :, at] = value_states.transpose(1, 2)
        n = self.owner.visible  # attention reads the first n columns: every row's tokens, not the whole capacity
        return self.keys[:, :, :n], self.values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.visible, 0

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class RowCache(Cache):
    """transformers' Cache over `RowLayer`s; `write_at` [B, k] is set before every forward."""

    def __init__(self, n_layers: int) -> None:
        super().__init__(layers=[RowLayer(self) for _ in range(n_layers)])
        self.write_at = torch.zeros(0, 0, dtype=torch.long)
        self.visible = 0  # columns the attention reads (a multiple of VISIBLE_STEP, at most the capacity)


class StaticLM:
    """`CachedLM`'s interface over a `RowCache` of fixed batch and capacity; forwards compiled per k (CPU: k = 1, k ≥ 2)."""

    def __init__(self, model: PreTrainedModel, capacity: int, compile_mode: str | None = None) -> None:
        if capacity < 2:
            raise ValueError(f"forward.capacity={capacity}: the fast path's KV cache needs at least 2 columns")
        if refusal := fast_path_refusal(model.config):
            raise ValueError(f"forward.path=static/compiled: {refusal}")
        impl = model.config._attn_implementation
        self.source = model
        self.model = model
        self.compiled = compile_mode is not None
        if self.compiled and impl != "eager":
            # The grouped form (`attention.grouped_attention`) beats eager's and SDPA's compiled at every k
            # (analysis/fast_path_one_copy_cpu_amx/); on a copy of the modules sharing the parameters (memo).
            self.model = copy.deepcopy(model, memo={id(t): t for t in (*model.parameters(), *model.buffers())})
            self.model.set_attn_implementation(GROUPED)
            tabulate_rotary(self.model, capacity)  # cos and sin looked up, not recomputed in every layer
            if model.device.type == "cpu" and model.dtype == torch.float32:
                cpu_matvec.available()  # built and loaded before a compile asks `attention.cache_kernel`
        self.additive_mask = self.model.config._attn_implementation in ADDITIVE_MASKS
        self.cache_keyword = cache_keyword(type(self.model))
        self.device = model.device
        self.windows = attention_windows(model.config)
        self.capacity = capacity
        self.symbolic_columns = symbolic_columns(self.device)
        with torch.inference_mode():  # a decode's tensors are inference tensors: so are its column ranges
            self._columns = torch.arange(capacity, device=self.device)
        self._column_views: dict[int, torch.Tensor] = {}  # n -> columns 0..n-1, marked for dynamo once
        self.cache = RowCache(model.config.get_text_config(decoder=True).num_hidden_layers)
        self.slots: list[int] = []  # the active rows' slots in the buffers (finished rows keep theirs)
        self.lengths: list[int] = []  # committed tokens cached per slot (= its next write column)
        self.compile_seconds = 0.0  # warm_up's wall time: compilation (and the first run) of every shape
        self.new_shapes = 0  # forwards outside warm_up that met a shape warm_up had not
        self.skip_guards = True  # met shapes skip dynamo's full guard check (analysis/guards_cpu_avx512/)
        self._shapes: set[tuple[int, int]] = set()
        concat = concat_linears(model)
        self.weights_key = weights_fingerprint(model) if self.compiled else ""  # FUSION_PASS's cache key
        self._forward = (
            compiled_forward(self._step, compile_mode, model.device, concat) if self.compiled else self._step
        )

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def n_valid_host(self) -> list[int]:
        """Committed tokens cached per active row (`CachedLM`'s name for it)."""
        return [self.lengths[s] for s in self.slots]

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """One forward of tokens [S, k] at positions [S, k] (= their columns), S = every slot, attending to
        `columns` [n] = 0..n-1 (n > every position); logits [S, k, V]."""
        self.cache.write_at = positions
        n = columns.shape[0]
        torch._check(n >= 2)
        torch._check(n <= self.capacity)
        self.cache.visible = n
        allowed = columns[None, None, None, :] <= positions[:, None, :, None]  # [S, 1, k, n]
        masks = {
            layer_type: allowed if window is None else allowed & (columns > positions[:, None, :, None] - window)
            for layer_type, window in self.windows.items()
        }
        if self.additive_mask:  # 0 where allowed, the dtype's min elsewhere
            low = torch.finfo(self.model.dtype).min
            masks = {t: torch.zeros_like(m, dtype=self.model.dtype).masked_fill(~m, low) for t, m in masks.items()}
        mask = masks if len(masks) > 1 else next(iter(masks.values()))
        cache = {self.cache_keyword: self.cache}  # the keyword read once in __init__: dynamo would trace its lookup
        return self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **cache, use_cache=True).logits

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Every row prefilled alone (eagerly) into its slot; logits [B, V] after each prompt.

        The buffers are reused while the batch size is unchanged (a compiled forward keeps them)."""
        longest = max(len(ids) for ids in prompts)
        if longest > self.capacity:
            raise ValueError(
                f"forward.capacity={self.capacity}: a prompt of {longest} tokens does not fit the fast path's KV cache"
            )
        done: dict[tuple[int, ...], tuple[DynamicCache, torch.Tensor]] = {}  # a repeated prompt is prefilled once
        per_row, last_logits = [], []
        for ids in prompts:
            if tuple(ids) not in done:
                cache = DynamicCache()
                x = to_device([ids], self.device)
                # The shared model (its own attention): a prompt-long prefill is what SDPA is fast at.
                out = self.source(input_ids=x, **with_cache(self.source, cache), use_cache=True, logits_to_keep=1)
                done[tuple(ids)] = cache, out.logits[0, -1]
            cache, logits = done[tuple(ids)]
            per_row.append(cache)
            last_logits.append(logits)
        for i, layer in enumerate(self.cache.layers):
            first = per_row[0].layers[i].keys  # [1, kv_heads, n, d]
            self._allocate(layer, (len(prompts), first.shape[1], self.capacity, first.shape[-1]), first.dtype)
            for row, (cache, ids) in enumerate(zip(per_row, prompts)):
                layer.keys[row, :, : len(ids)] = cache.layers[i].keys[0]
                layer.values[row, :, : len(ids)] = cache.layers[i].values[0]
        self.slots = list(range(len(prompts)))
        self.lengths = [len(ids) for ids in prompts]
        return torch.stack(last_logits)

    @torch.inference_mode()
    def prefill_from(self, source: StaticLM, prompts: list[list[int]]) -> None:
        """Start these rows with a copy of `source`'s KV rather than a forward of this model: `source` has just
        prefilled the same prompts with a model of the same architecture (a weight-only copy's target)."""
        check_prefill_source(source, StaticLM, self.model.config, prompts)
        if source.capacity != self.capacity:
            raise ValueError(f"prefill_from: the source's capacity is {source.capacity}, this one's {self.capacity}")
        width = max(len(ids) for ids in prompts)
        for layer, theirs in zip(self.cache.layers, source.cache.layers):
            self._allocate(layer, tuple(theirs.keys.shape), theirs.keys.dtype)
            layer.keys[:, :, :width] = theirs.keys[:, :, :width]
            layer.values[:, :, :width] = theirs.values[:, :, :width]
        self.slots = list(range(len(prompts)))
        self.lengths = [len(ids) for ids in prompts]

    @torch.inference_mode()
    def take_columns(self, source: StaticLM, start: int, stop: int) -> None:
        """Copy `source`'s K/V of columns start..stop-1 into this LM's own buffers (a draft takes its target's verify's)."""
        mine, theirs = self.cache.layers, source.cache.layers
        if len(mine) != len(theirs) or mine[0].keys.shape != theirs[0].keys.shape:
            raise ValueError(
                f"take_columns: the source's KV is {len(theirs)} layers of {tuple(theirs[0].keys.shape)} (slots, kv "
                f"heads, columns, head size), this one's {len(mine)} of {tuple(mine[0].keys.shape)}"
            )
        n = min(stop, self.capacity) - start
        torch._foreach_copy_(  # 2 x layers small copies in one call (counted in C_o)
            [t.narrow(2, start, n) for layer in mine for t in (layer.keys, layer.values)],
            [t.narrow(2, start, n) for layer in theirs for t in (layer.keys, layer.values)],
        )

    def _allocate(self, layer: RowLayer, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Give `layer` buffers of this shape, keeping the ones it has when they fit (a compiled graph writes
        them in place: their address must not change)."""
        if layer.keys is not None and tuple(layer.keys.shape) == shape and layer.keys.dtype == dtype:
            return
        layer.keys = torch.zeros(shape, dtype=dtype, device=self.device)
        layer.values = torch.zeros(shape, dtype=dtype, device=self.device)
        if self.compiled:
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)
        layer.is_initialized = True

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [B, k] to the active rows (all valid) and return their logits [B, k, V]."""
        k = tokens.shape[1]
        full = max(self.lengths[s] for s in self.slots) + k
        if full > self.capacity:
            raise ValueError(
                f"forward.capacity={self.capacity}: a row would hold {full} tokens; raise forward.capacity "
                "(null sizes it from the prompts, max_new_tokens and gamma)"
            )
        active = set(self.slots)
        # A finished slot writes at columns 0..k-1: it is never read again.
        starts = [self.lengths[s] if s in active else 0 for s in range(len(self.lengths))]
        positions = to_device([[n + i for i in range(k)] for n in starts], self.device)  # [S, k]
        columns = self._columns_to(max(starts) + k)  # [n]
        if len(self.slots) < len(self.lengths):
            index = to_device(self.slots, self.device)
            tokens = torch.zeros(len(self.lengths), k, dtype=tokens.dtype, device=self.device).index_copy_(
                0, index, tokens
            )
        if not tokens.is_inference():
            # Dynamo guards on the dispatch keys: a normal tensor (warm-up's, a caller's) and an inference
            # tensor (a decode's) would get a graph each, the second compiled inside a timed decode.
            tokens = tokens.clone()
        if k >= 2 and self.compiled and self.symbolic_columns:  # one graph for every verify width, not one per γ
            for t in (tokens, positions):  # (analysis/gamma_sweep_fast_path_cpu_amx/)
                torch._dynamo.maybe_mark_dynamic(t, 1)
        logits = self._run(tokens, positions, columns)
        for s in self.slots:
            self.lengths[s] += k
        return logits if len(self.slots) == len(self.lengths) else logits[to_device(self.slots, self.device)]

    def _columns_to(self, need: int) -> torch.Tensor:
        """Columns 0..n-1 a forward attends to, given the most any row holds after it. `symbolic_columns`
        (CPU): n is that rounded up to VISIBLE_STEP, so attention costs what the rows hold, not the capacity
        (analysis/fast_path_visible_cpu_amx/), and compiled, a
        symbol of the graph (unbacked: nothing may guard on its value), so one graph per (S, k) serves every n.
        Otherwise (GPU) the whole capacity: one static shape per (S, k), as CUDA graphs need."""
        n = min(self.capacity, -(-need // VISIBLE_STEP) * VISIBLE_STEP) if self.symbolic_columns else self.capacity
        if n not in self._column_views:
            view = self._columns[:n]
            if self.compiled and self.symbolic_columns:
                torch._dynamo.decorators.mark_unbacked(view, 0)
            self._column_views[n] = view
        return self._column_views[n]

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """The forward at tokens' shape; a forward that compiles outside warm-up is counted in `new_shapes`."""
        shape = (len(self.lengths), tokens.shape[1])
        if self.compiled:  # any call may compile: inductor's cache entry must be this model's (`FuseSharedInputs`)
            FUSION_PASS.weights = self.weights_key
        if shape in self._shapes:
            if not (self.compiled and self.skip_guards):
                return self._forward(tokens, positions, columns)
            # Dynamo checks ~400 guards (every weight and cache tensor) before each call, a visible share of a
            # small forward (analysis/guards_cpu_avx512/). A met shape has its own graph, told apart by the
            # input shapes, so only those run; should it not fit after all, dynamo refuses to recompile under
            # this stance, the full check runs below and the compile inside a decode is counted, never silent.
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._forward(tokens, positions, columns)
            except RuntimeError as exc:
                if "skip_guard_eval_unsafe" not in str(exc):
                    raise
        self._shapes.add(shape)
        self.new_shapes += 1
        return self._forward(tokens, positions, columns)

    def warm_up(self, batch_size: int, ks: Sequence[int]) -> float:
        """Compile (and run once) the forward of every k at this batch size; returns the seconds it took
        (added to `compile_seconds`). The cache's contents are left undefined: prefill before use."""
        start = time.perf_counter()
        for k in ks:
            self.prefill([[0]] * batch_size)
            self.feed(torch.zeros(batch_size, k, dtype=torch.long, device=self.device))
        self.new_shapes = 0
        seconds = time.perf_counter() - start
        self.compile_seconds += seconds
        return seconds

    def uncache_last(self, counts: Sequence[int] | torch.Tensor) -> None:
        """Forget each active row's last `counts[b]` tokens (a length change)."""
        if isinstance(counts, torch.Tensor):
            (counts,) = to_host(counts)
        for row, (slot, c) in enumerate(zip(self.slots, counts)):
            if not 0 <= int(c) <= self.lengths[slot]:
                raise ValueError(f"uncache_last: row {row} has {self.lengths[slot]} cached tokens, asked to drop {c}")
        for slot, c in zip(self.slots, counts):
            self.lengths[slot] -= int(c)

    def keep_last_fed(
        self, fed: int, keep: torch.Tensor | Sequence[int], keep_host: Sequence[int] | None = None
    ) -> None:
        """Of the last `fed` tokens, keep the first `keep[b]` of each active row (a length change)."""
        if keep_host is None:
            keep_host = to_host(keep)[0] if isinstance(keep, torch.Tensor) else list(keep)
        for slot, k in zip(self.slots, keep_host):
            self.lengths[slot] -= fed - int(k)

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only these active rows; the others keep their slots, idle (the shapes stay fixed)."""
        if isinstance(rows, torch.Tensor):
            (rows,) = to_host(rows)
        self.slots = [self.slots[int(r)] for r in rows]

    def check_mirrors(self) -> None:
        """Raise AssertionError unless slots and lengths fit the buffers (tests)."""
        for layer in self.cache.layers:
            assert layer.keys.shape[0] == len(self.lengths), (layer.keys.shape, self.lengths)
        assert self.slots == sorted(set(self.slots)), self.slots
        assert all(0 <= n <= self.capacity for n in self.lengths), self.lengths

    def row_kv_bytes(self) -> int:
        """Bytes each row holds: its slot's whole preallocated capacity, keys and values of every layer."""
        return sum(t[0].numel() * t.element_size() for layer in self.cache.layers for t in (layer.keys, layer.values))

    def row_kv(self, row: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed keys and values of one active row: [heads, n_valid, d] each (for tests)."""
        slot = self.slots[row]
        n = self.lengths[slot]
        cache_layer = self.cache.layers[layer]
        return cache_layer.keys[slot, :, :n], cache_layer.values[slot, :, :n]
