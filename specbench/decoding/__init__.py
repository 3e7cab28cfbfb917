"""The decoding core: sampling, the acceptance rule, KV caches, drafts, the round loop, timing, raw records."""
