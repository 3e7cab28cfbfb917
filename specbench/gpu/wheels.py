"""The wheels the GPU machine needs beside its image (`scripts/gpu_check.sh --fetch-wheels / --rehearse`).

The image (device tool's KINDS.md: Python 3.12, torch 2.11, transformers 5.17, huggingface_hub 1.33, pandas,
pyarrow, matplotlib, nvidia-ml-py, ...) lacks only specbench's config and tuning stack. Those are carried at
the versions tested here; transformers is not: specbench runs on the image's 5.17 (`kvcache.with_cache`), since a
newer one needs a huggingface_hub the image does not have, and carrying that chain would replace half the image.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

# What the image lacks and specbench imports (hydra's and optuna's own dependencies included).
MISSING_ON_IMAGE = (
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",  # sdist only on PyPI: built into a wheel by --fetch-wheels
    "optuna",
    "alembic",
    "sqlalchemy",
    "mako",
    "colorlog",
    "platformdirs",
)
# The image's versions (device tool's KINDS.md, read 2026-11) of specbench's other requirements.
IMAGE_VERSIONS = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "huggingface-hub": "1.33.0",
    "accelerate": "1.15.0",
    "safetensors": "0.8.0",
    "numpy": "2.5.2",
}
# The image's versions of what the carried wheels and specbench's imports need: a rehearsal venv starts with these.
IMAGE_PINS = (
    "transformers==5.17.0",
    "huggingface_hub==1.33.0",
    "numpy==2.5.2",
    "pyyaml",
    "packaging",
    "tqdm",
    "markupsafe",
    "typing-extensions",
)


def pins(names=MISSING_ON_IMAGE) -> list[str]:
    """`name==version` as installed here (the tested set); a bare name where it is not installed."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


if __name__ == "__main__":
    print(" ".join(pins() if sys.argv[1:] != ["image"] else IMAGE_PINS))
