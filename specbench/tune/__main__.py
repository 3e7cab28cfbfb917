"""`python -m specbench.tune STORAGE [--out DIR]` (see `specbench.tune.cli`)."""

from specbench.tune.cli import main

main()
