"""What names a job folder: its overrides, escaped, and the kind of machine that measured it.

Why: Hydra's `override_dirname` is the overrides as typed, so a value holding `/` or `..`
(`workload.path=../../t.jsonl`) makes folders that collapse into one another, or land outside
`runs/`; and a folder keyed by overrides alone lets a second kind of machine skip the jobs a first
kind finished. So a job folder is `<escaped overrides>,hw=<machine key>`: the overrides with every
character outside a safe set percent-encoded (no separator survives, so no `..` can climb; distinct
overrides give distinct names; a name too long for a file system is cut and ends with a hash of
the whole), and the machine key (`machine_key`) naming what changes the numbers.

conf/config.yaml builds the folder with the `specbench.job_dir` resolver registered here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from importlib import metadata
from typing import Any

import yaml
from omegaconf import OmegaConf

from specbench.bench.envinfo import cpu_class, cpu_isa_flags, cpu_model, gpu_info, usable_cores
from specbench.config.checks import check_sweep_name

MAX_NAME = 200  # bytes of a job folder name (file systems allow 255)
_UNSAFE = re.compile(r"[^A-Za-z0-9=,._+@-]")
# Keys of a resolved config that do not change a job's numbers (where it is stored, whether to re-run).
NOT_RESULTS = ("runs_dir", "sweep_name", "force", "report")


class JobConflict(Exception):
    """A done job folder holds results of another config than the job about to skip it."""


def escape_name(override_dirname: str) -> str:
    """A single, safe folder name for Hydra's override_dirname (percent-encoding, injective)."""
    name = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), override_dirname)
    if name.startswith("."):  # never hidden, never "." or ".."
        name = "%2E" + name[1:]
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 17] + "~" + hashlib.sha256(override_dirname.encode()).hexdigest()[:16]
    return name


def _torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _gpu_name() -> str | None:
    return gpu_info().get("name")


def machine_record(device: str, forward: str, dtype: str) -> dict[str, Any]:
    """What changes a job's numbers beside its config: hardware, kernels forced by the environment,
    cores, torch version, forward path and dtype. Read without importing torch."""
    on_gpu = str(device).startswith("cuda")
    return {
        "device": str(device),
        "hardware": _gpu_name() if on_gpu else cpu_model(),
        "cpu_class": None if on_gpu else cpu_class(),
        "isa_flags": [] if on_gpu else list(cpu_isa_flags()),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
        "cores": usable_cores(),
        "torch": _torch_version(),
        "forward": str(forward),
        "dtype": str(dtype),
    }


def machine_key(device: str, forward: str, dtype: str) -> str:
    """`<cpu class or GPU name>-<hash of machine_record>`, e.g. `amx-1a2b3c4d`: equal keys, comparable numbers."""
    rec = machine_record(device, forward, dtype)
    digest = hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:8]
    kind = rec["cpu_class"] or re.sub(r"[^A-Za-z0-9]+", "_", rec["hardware"] or "gpu").strip("_")
    return f"{kind}-{digest}"


def job_dir_name(override_dirname: str, device: str, forward: str, dtype: str) -> str:
    """The job folder's name: escaped overrides, then `hw=<machine key>` (alone when there are no overrides)."""
    hw = f"hw={machine_key(device, forward, dtype)}"
    return f"{escape_name(override_dirname)},{hw}" if override_dirname else hw


def sweep_dir(runs_dir: str, sweep_name: str) -> str:
    """`<runs_dir>/<sweep_name>`; a sweep_name that would climb out of runs_dir stops the run (exit 2)
    here, before Hydra makes a folder there."""
    try:
        check_sweep_name(sweep_name)
    except ValueError as exc:
        print(f"specbench: invalid config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return f"{runs_dir}/{sweep_name}"


def register_resolver() -> None:
    """`${specbench.sweep_dir:${runs_dir},${sweep_name}}` and
    `${specbench.job_dir:${hydra:job.override_dirname},${pair.device},${forward.path},${pair.dtype}}`."""
    for name, fn in (("specbench.sweep_dir", sweep_dir), ("specbench.job_dir", job_dir_name)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def config_diff(stored_yaml: str, new_yaml: str) -> list[str]:
    """`key: stored -> new` for every result-changing key where two resolved configs differ."""
    a, b = _flat(yaml.safe_load(stored_yaml) or {}), _flat(yaml.safe_load(new_yaml) or {})
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k.split(".")[0] not in NOT_RESULTS)
    return [f"{k}: {a.get(k)!r} there, {b.get(k)!r} here" for k in keys]
