import sys

from specbench.deploy.cli import main

if __name__ == "__main__":
    sys.exit(main())
