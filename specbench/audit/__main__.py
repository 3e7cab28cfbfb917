"""`python -m specbench.audit`: see `specbench.audit.cli`."""

import sys

from specbench.audit.cli import main

sys.exit(main())
