"""The config checks: each names the field, the bad value and what is allowed."""

from __future__ import annotations

from typing import Any


def choice(name: str, value: Any, allowed: tuple) -> None:
    """Raise unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {list(allowed)}")


def at_least(name: str, value: Any, low: int, nullable: bool = False) -> None:
    """Raise unless `value` is an integer >= `low` (or None, when `nullable`)."""
    if nullable and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r}: must be {'null or ' if nullable else ''}an integer >= {low}")


def check_sweep_name(name: str) -> None:
    """Raise unless `name` is a relative folder that stays inside runs_dir (no '..', '.' or empty part)."""
    if not isinstance(name, str) or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        raise ValueError(f"sweep_name={name!r}: must be a folder inside runs_dir (no '..', '.', empty part)")
