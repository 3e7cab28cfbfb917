"""`python -m specbench.tune STORAGE [--out DIR]` (see `specbench.tune.cli`)."""

import sys

from specbench.tune.cli import main

sys.exit(main())
