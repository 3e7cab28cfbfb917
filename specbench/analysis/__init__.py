"""Analysis of raw rows: acceptance, costs, speedups and serving metrics, all computed from runs/ alone."""
