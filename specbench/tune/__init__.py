"""Choose γ (and the draft) per workload, batch size and sampling config with Optuna.

`python -m specbench +tune=gamma` runs one Optuna study per (workload [category], batch
size, sampling config) with the ask/tell API. Every trial is a real measurement through
the benchmark protocol of sweep jobs (`specbench.bench.protocol`): the speculative decoder
at the trial's (draft, γ) and the autoregressive baseline decode the same prompt batches
with the same seeds, interleaved batch by batch, under telemetry, into the same request and
round rows a job writes.

Modules: `objectives` (the OBJECTIVES registry), `paired` (paired per-batch statistics from
request rows), `samplers` (SAMPLERS: local search, tpe, random, grid), `study` (storage, the
paired pruner, planning, open/resume), `profile` (the cost model's trial 0 and the reference
throughput), `runner` (trials, `run_tune`), `recommend` (the table), `cli` (`python -m
specbench.tune STORAGE`). The config is `specbench.config.TuneConfig`.
"""
