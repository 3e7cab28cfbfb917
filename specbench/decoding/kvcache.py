"""A causal LM plus its KV cache, for rows that commit different numbers of tokens.

The cache is rectangular ([B, heads, L, d] per layer) while rows are ragged, so
columns carry a validity mask: a rejected draft's column becomes a hole that no
query attends to, and positions come from each row's count of valid columns.
Invariant (tested): a row's valid columns are exactly its committed tokens, in
order, with the KV a fresh prefill of those tokens gives.

No host syncs. Everything whose *value* decides a tensor shape or a branch (how
many tokens a row still needs, how many tail columns to crop, when to compact)
is read from host mirrors of the mask, kept in step with it from values the
host already has: `n_valid_host` (committed tokens cached per row) and `runs`
(each row's valid columns as [start, end) runs). The decoder passes the accepted
counts it synced once per round; a method given only a tensor syncs it itself
(counted, see `specbench.timing.to_host`). Host->device data goes through
`to_device` (async on CUDA), and the attention mask is built here as a 4D mask
so that transformers does not inspect the 2D mask's values on the host
(`padding_mask.all()` in its SDPA mask path syncs on every 1-token forward).

Sliding-window models (Mistral, Qwen2/Gemma2-style mixes of sliding and full
layers): the cache keeps every committed token in every layer, and a sliding
layer's mask lets a query see only the keys whose *position* (the row's count of
valid columns before them) is within the window, so holes never count against it.
With mixed layer types the model gets one mask per type, as transformers passes
them (`{"full_attention": m, "sliding_attention": m2}`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from specbench.decoding.timing import to_device, to_host

# Attention implementations whose 4D mask we build ourselves (bool: True = attend;
# eager: additive 0 / dtype-min). Any other gets the 2D mask and builds its own.
_OWN_MASK = ("sdpa", "eager")
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"  # transformers' layer_types names


@functools.cache
def cache_keyword(model_class: type) -> str:
    """The forward keyword for a KV cache: `cache` in transformers >= 5.24, `past_key_values` before (the GPU
    image ships 5.17; a wrong name is swallowed by **kwargs and the cache silently ignored)."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_cache(model: PreTrainedModel, cache) -> dict:
    """`{cache_keyword: cache}` for `model`'s forward."""
    return {cache_keyword(type(model)): cache}


def attention_windows(config) -> dict[str, int | None]:
    """The model's attention layer types -> sliding window (None = full), read as transformers reads them.

    `layer_types` when the config has it, else every layer slides when `sliding_window`
    is set (Mistral). Any other layer type (chunked, linear, ...) is refused with a ValueError.
    """
    text = config.get_text_config(decoder=True)
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types is None:
        chunk = getattr(text, "attention_chunk_size", None)
        if chunk is not None:
            raise ValueError(
                f"model config attention_chunk_size={chunk!r}: specbench's KV cache supports only "
                "full and sliding-window attention"
            )
        types = [SLIDING_ATTENTION if window is not None else FULL_ATTENTION]
    windows: dict[str, int | None] = {}
    for i, layer_type in enumerate(types):
        if layer_type not in (FULL_ATTENTION, SLIDING_ATTENTION):
            raise ValueError(
                f"model config layer_types[{i}]={layer_type!r}: specbench's KV cache supports only "
                f"{[FULL_ATTENTION, SLIDING_ATTENTION]} layers"
            )
        if layer_type == SLIDING_ATTENTION and not (isinstance(window, int) and window >= 1):
            raise ValueError(f"model config sliding_window={window!r}: sliding layers need an integer >= 1")
        windows[layer_type] = window if layer_type == SLIDING_ATTENTION else None
    return windows


def kv_layout(config) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a model's KV cache: two models whose layouts match can hold
    each other's KV (a weight-only copy and its target)."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    return (
        text.num_hidden_layers,
        getattr(text, "num_key_value_heads", None) or heads,
        getattr(text, "head_dim", None) or text.hidden_size // heads,
    )


def check_prefill_source(source, family: type, config, prompts: list[list[int]]) -> None:
    """Raise ValueError unless `source` is an LM of `family` (the receiver's cache kind) holding the KV of
    exactly these prompts' lengths, with nothing fed since, in a layout a model of `config` can read (what
    `prefill_from` copies)."""
    if not isinstance(source, family):
        raise ValueError(
            f"prefill_from: a {family.__name__} copies from a {family.__name__}, not a {type(source).__name__}"
        )
    lengths = [len(ids) for ids in prompts]
    if source.n_valid_host != lengths:
        raise ValueError(
            f"prefill_from: the source holds rows of {source.n_valid_host} tokens, the prompts have {lengths}; "
            "copy its KV right after its prefill of the same prompts"
        )
    if kv_layout(source.model.config) != kv_layout(config):
        raise ValueError(
            f"prefill_from: KV layout (layers, kv heads, head size) {kv_layout(source.model.config)} of the source, "
            f"{kv_layout(config)} here; only a model of the same architecture (a weight-only copy) can take it"
        )


def cache_row_kv_bytes(cache) -> int:
    """Bytes one batch row holds in a transformers cache: Σ over layers of its keys and values
    ([kv_heads, L, head_dim] each) × element size; 0 for an empty cache."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and t.dim() == 4 and t.shape[0]:  # [B, kv_heads, L, head_dim]
                total += t[0].numel() * t.element_size()
    return total


def feed_suffix(lm, seqs: list[list[int]]) -> torch.Tensor:
    """Feed each row's committed tokens that `lm` (a `CachedLM` or `StaticLM`) has not cached yet;
    logits [B, w, V].

    Rows need different counts (1 or 2); a row that needs fewer than the widest gets its last
    cached tokens un-cached and fed again, so every fed token is valid and the returned last
    position is each row's newest token.
    """
    need = [len(s) - n for s, n in zip(seqs, lm.n_valid_host)]
    width = max(need)
    lm.uncache_last([width - n for n in need])
    return lm.feed(to_device([s[-width:] for s in seqs], lm.device))


class CachedLM:
    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = model.device
        self.windows = attention_windows(model.config)  # layer type -> sliding window (None: full)
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in _OWN_MASK and any(w is not None for w in self.windows.values()):
            raise ValueError(
                f"model config _attn_implementation={impl!r}: sliding-window layers need one of {list(_OWN_MASK)} "
                "(their window must count each row's valid tokens, not cache columns)"
            )
        self.cache = DynamicCache()
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, L] valid columns
        self.n_valid = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] committed tokens cached
        self.n_valid_host: list[int] = []  # host mirror of n_valid
        self.runs: list[list[list[int]]] = []  # host mirror of mask: per row, ascending [start, end) valid runs

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Fresh cache for these rows; returns the logits [B, V] after each prompt.

        Rows are prefilled one at a time and left-padded into one cache, so no
        padding token is ever a query (a fully masked query row would give NaN).
        """
        per_row, last_logits = [], []
        for ids in prompts:
            cache = DynamicCache()
            x = to_device([ids], self.device)
            # logits_to_keep=1: only the last position is sampled (the lm_head over every
            # prompt position cost ~20% of prefill, paid by target and draft alike).
            out = self.model(input_ids=x, **with_cache(self.model, cache), use_cache=True, logits_to_keep=1)
            per_row.append(cache)
            last_logits.append(out.logits[0, -1])
        width = max(len(ids) for ids in prompts)
        self.cache = DynamicCache()
        for layer in range(len(per_row[0].layers)):
            keys, values = [], []
            for cache, ids in zip(per_row, prompts):
                k, v = cache.layers[layer].keys, cache.layers[layer].values
                pad = width - len(ids)
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            self.cache.update(torch.cat(keys), torch.cat(values), layer)
        lengths = [len(ids) for ids in prompts]
        self.n_valid = to_device(lengths, self.device)
        self.mask = torch.arange(width, device=self.device)[None, :] >= (width - self.n_valid)[:, None]
        self.n_valid_host = list(lengths)
        self.runs = [[[width - n, width]] for n in lengths]
        return torch.stack(last_logits)

    def prefill_from(self, source: CachedLM, prompts: list[list[int]]) -> None:
        """Start these rows with a copy of `source`'s KV rather than a forward of this model: `source` has just
        prefilled the same prompts with a model of the same architecture (a weight-only copy's target)."""
        check_prefill_source(source, CachedLM, self.model.config, prompts)
        self.cache = DynamicCache()
        for i, layer in enumerate(source.cache.layers):
            self.cache.update(layer.keys.clone(), layer.values.clone(), i)
        self.n_valid, self.mask = source.n_valid.clone(), source.mask.clone()
        self.n_valid_host = list(source.n_valid_host)
        self.runs = [[list(run) for run in row] for row in source.runs]

    def _attention_mask(self, k: int, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mask for a forward of k new (valid) columns at the end of `self.mask`, at `positions` [B, k].

        One 4D mask, or one per layer type when the model mixes sliding and full layers.
        """
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl not in _OWN_MASK:
            return self.mask.long()
        length = self.mask.shape[1]
        columns = torch.arange(length, device=self.device)
        causal = columns[None, :] <= columns[length - k :, None]  # [k, L]: query i sits at column L - k + i
        allowed = self.mask[:, None, None, :] & causal[None, None]  # [B, 1, k, L]
        masks = {}
        for layer_type, window in self.windows.items():
            mask = allowed
            if window is not None:
                key_pos = self.mask.long().cumsum(1) - 1  # [B, L]: a valid column's position in its row
                # transformers' sliding rule: key position > query position - window.
                mask = allowed & (key_pos[:, None, None, :] > positions[:, None, :, None] - window)
            masks[layer_type] = mask if impl == "sdpa" else self._additive(mask)
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Bool mask -> eager attention's additive mask (0 where allowed, dtype-min elsewhere)."""
        dtype = self.model.dtype
        additive = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        return additive.masked_fill_(~allowed, torch.finfo(dtype).min)

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [B, k] (all valid) and return their logits [B, k, V]."""
        k = tokens.shape[1]
        start = self.mask.shape[1]
        self.mask = torch.cat([self.mask, torch.ones_like(tokens, dtype=torch.bool)], dim=1)
        positions = self.n_valid[:, None] + torch.arange(k, device=self.device)[None, :]
        out = self.model(
            input_ids=tokens,
            attention_mask=self._attention_mask(k, positions),
            position_ids=positions,
            **with_cache(self.model, self.cache),
            use_cache=True,
        )
        self.n_valid = self.n_valid + k
        for row, runs in enumerate(self.runs):
            if runs and runs[-1][1] == start:
                runs[-1][1] = start + k
            else:
                runs.append([start, start + k])
            self.n_valid_host[row] += k
        return out.logits

    def uncache_last(self, counts: Sequence[int] | torch.Tensor) -> None:
        """Turn each row's last `counts[b]` valid columns into holes."""
        if isinstance(counts, torch.Tensor):
            (counts,) = to_host(counts)
        counts = [int(c) for c in counts]
        if not any(c > 0 for c in counts):
            return
        for row, c in enumerate(counts):
            if not 0 <= c <= self.n_valid_host[row]:
                raise ValueError(
                    f"uncache_last: row {row} has {self.n_valid_host[row]} cached tokens, asked to drop {c}"
                )
        counts_t = to_device(counts, self.device)
        rank_from_end = self.mask.flip(1).long().cumsum(1).flip(1)  # 1 = last valid column
        self.mask = self.mask & ~(self.mask & (rank_from_end <= counts_t[:, None]))
        self.n_valid = self.n_valid - counts_t
        for row, c in enumerate(counts):
            runs = self.runs[row]
            while c:
                start, end = runs[-1]
                drop = min(c, end - start)
                if drop == end - start:
                    runs.pop()
                else:
                    runs[-1][1] = end - drop
                c -= drop
            self.n_valid_host[row] -= counts[row]
        self._trim()

    def keep_last_fed(
        self, fed: int, keep: torch.Tensor | Sequence[int], keep_host: Sequence[int] | None = None
    ) -> None:
        """Of the last `fed` columns, keep the first `keep[b]` of each row; the rest become holes.

        `keep` may be a device tensor, a host list, or both (`keep_host`, what the
        decoder passes: no sync). A tensor without `keep_host` is synced (counted).
        """
        if keep_host is None:
            if isinstance(keep, torch.Tensor):
                (keep_host,) = to_host(keep)
            else:
                keep_host = list(keep)
        keep_host = [int(k) for k in keep_host]
        if not isinstance(keep, torch.Tensor):
            keep = to_device(keep_host, self.device)
        length = self.mask.shape[1]
        column = torch.arange(length, device=self.device)[None, :]
        rejected = column >= length - fed + keep[:, None]  # keep >= 0: only the fed columns
        self.mask = self.mask & ~rejected
        self.n_valid = self.n_valid - (fed - keep)
        for row, k in enumerate(keep_host):
            cut = length - fed + max(k, 0)
            runs = self.runs[row]
            while runs and runs[-1][0] >= cut:
                runs.pop()
            if runs and runs[-1][1] > cut:
                runs[-1][1] = cut
            self.n_valid_host[row] -= fed - k
        self._trim()

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only these batch rows (finished rows stop costing work)."""
        if isinstance(rows, torch.Tensor):
            (rows,) = to_host(rows)
        rows = [int(r) for r in rows]
        index = to_device(rows, self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.n_valid = self.n_valid[index]
        self.n_valid_host = [self.n_valid_host[r] for r in rows]
        self.runs = [[list(run) for run in self.runs[r]] for r in rows]
        self._trim()

    def _trim(self) -> None:
        """Drop columns no row uses; compact when holes outnumber tokens (all decided on the host)."""
        length = self.mask.shape[1]
        if length == 0:
            return
        used = max((runs[-1][1] for runs in self.runs if runs), default=0)
        tail = length - used
        if tail:
            self.cache.crop(-tail)
            self.mask = self.mask[:, :used]
        if self.mask.shape[1] > 2 * max(self.n_valid_host, default=0) + 16:
            self._compact()

    def _compact(self) -> None:
        """Right-align every row's valid columns, dropping holes (a gather per layer)."""
        width = max(self.n_valid_host, default=0)
        length = self.mask.shape[1]
        # For each row, the indices of its valid columns, left-padded with hole columns.
        order = torch.sort(self.mask.long(), dim=1, stable=True).indices[:, length - width :]  # [B, width]
        new_mask = torch.arange(width, device=self.device)[None, :] >= (width - self.n_valid)[:, None]
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.mask = new_mask
        self.runs = [[[width - n, width]] if n else [] for n in self.n_valid_host]

    def check_mirrors(self) -> None:
        """Raise AssertionError unless the host mirrors match the device mask (tests; syncs)."""
        mask = self.mask.cpu()
        assert self.n_valid.tolist() == self.n_valid_host == mask.sum(1).tolist(), (
            self.n_valid.tolist(),
            self.n_valid_host,
            mask.sum(1).tolist(),
        )
        for row, runs in enumerate(self.runs):
            cols = [c for start, end in runs for c in range(start, end)]
            assert cols == mask[row].nonzero().flatten().tolist(), (row, runs, mask[row])
            assert all(start < end for start, end in runs), (row, runs)
        assert self.mask.shape[1] == max((r[-1][1] for r in self.runs if r), default=0) or self.mask.shape[1] == 0
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                assert layer.keys.shape[2] == self.mask.shape[1], (layer.keys.shape, self.mask.shape)

    def row_kv_bytes(self) -> int:
        """Bytes of KV cache each row holds now: its allocated columns (the cache is rectangular, so every
        row holds all of them, holes and left padding included) × per-column bytes, read off the tensors."""
        return cache_row_kv_bytes(self.cache)

    def row_kv(self, row: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid (committed) keys and values of one row: [heads, n_valid, d] each (for tests)."""
        cols = self.mask[row]
        cache_layer = self.cache.layers[layer]
        return cache_layer.keys[row][:, cols], cache_layer.values[row][:, cols]
