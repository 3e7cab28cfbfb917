"""A causal LM plus its KV cache, for rows that commit different numbers of tokens.

The cache is rectangular ([B, heads, L, d] per layer) while rows are ragged, so
columns carry a validity mask: a rejected draft's column becomes a hole that no
query attends to, and positions come from each row's count of valid columns.
Invariant (tested): a row's valid columns are exactly its committed tokens, in
order, with the KV a fresh prefill of those tokens gives.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


class CachedLM:
    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = model.device
        self.cache = DynamicCache()
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, L] valid columns
        self.n_valid = torch.zeros(0, dtype=torch.long, device=self.device)  # [B] committed tokens cached

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
            x = torch.tensor([ids], device=self.device)
            out = self.model(input_ids=x, cache=cache, use_cache=True)
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
        lengths = torch.tensor([len(ids) for ids in prompts], device=self.device)
        self.mask = torch.arange(width, device=self.device)[None, :] >= (width - lengths)[:, None]
        self.n_valid = lengths
        return torch.stack(last_logits)

    @torch.inference_mode()
    def feed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [B, k] (all valid) and return their logits [B, k, V]."""
        k = tokens.shape[1]
        self.mask = torch.cat([self.mask, torch.ones_like(tokens, dtype=torch.bool)], dim=1)
        positions = self.n_valid[:, None] + torch.arange(k, device=self.device)[None, :]
        out = self.model(
            input_ids=tokens,
            attention_mask=self.mask.long(),
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
        )
        self.n_valid = self.n_valid + k
        return out.logits

    def feed_suffix(self, seqs: list[list[int]]) -> torch.Tensor:
        """Feed each row's committed tokens that are not cached yet; logits [B, w, V].

        Rows need different counts (1 or 2); a row that needs fewer than the widest
        gets its last cached tokens un-cached and fed again, so every fed token is
        valid and the returned last position is each row's newest token.
        """
        need = [len(s) - n for s, n in zip(seqs, self.n_valid.tolist())]
        width = max(need)
        self.uncache_last(torch.tensor([width - n for n in need], device=self.device))
        return self.feed(torch.tensor([s[-width:] for s in seqs], device=self.device))

    def uncache_last(self, counts: torch.Tensor) -> None:
        """Turn each row's last `counts[b]` valid columns into holes."""
        if not bool((counts > 0).any()):
            return
        rank_from_end = self.mask.flip(1).long().cumsum(1).flip(1)  # 1 = last valid column
        self.mask = self.mask & ~(self.mask & (rank_from_end <= counts[:, None]))
        self.n_valid = self.n_valid - counts
        self._trim()

    def keep_last_fed(self, fed: int, keep: torch.Tensor) -> None:
        """Of the last `fed` columns, keep the first `keep[b]` of each row; the rest become holes."""
        length = self.mask.shape[1]
        column = torch.arange(length, device=self.device)[None, :]
        rejected = (column >= length - fed + keep[:, None]) & (column >= length - fed)
        self.mask = self.mask & ~rejected
        self.n_valid = self.n_valid - (fed - keep)
        self._trim()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (finished rows stop costing work)."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.n_valid = self.n_valid[rows]
        self._trim()

    def _trim(self) -> None:
        """Drop columns no row uses; compact when holes outnumber tokens."""
        valid_cols = self.mask.any(0)
        length = self.mask.shape[1]
        if length == 0:
            return
        tail = int(length - (valid_cols.nonzero().max().item() + 1 if valid_cols.any() else 0))
        if tail:
            self.cache.crop(-tail)
            self.mask = self.mask[:, : length - tail]
        if self.mask.shape[1] > 2 * int(self.n_valid.max().item()) + 16:
            self._compact()

    def _compact(self) -> None:
        """Right-align every row's valid columns, dropping holes (a gather per layer)."""
        width = int(self.n_valid.max().item())
        # For each row, the indices of its valid columns, left-padded with column 0.
        order = torch.sort(self.mask.long(), dim=1, stable=True).indices[:, -width:]  # [B, width]
        new_mask = torch.arange(width, device=self.device)[None, :] >= (width - self.n_valid)[:, None]
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.mask = new_mask

    def row_kv(self, row: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid (committed) keys and values of one row: [heads, n_valid, d] each (for tests)."""
        cols = self.mask[row]
        cache_layer = self.cache.layers[layer]
        return cache_layer.keys[row][:, cols], cache_layer.values[row][:, cols]
