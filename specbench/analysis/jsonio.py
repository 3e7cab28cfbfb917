"""JSON files for profiles: one `to_json` / `from_json` for every class with `to_dict` / `from_dict`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonFile:
    """Mixin: write `to_dict()` as JSON and read it back through `from_dict` (what-if profiles travel as files)."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - provided by the profile
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:  # pragma: no cover - provided by the profile
        raise NotImplementedError

    def to_json(self, path) -> Path:
        """Write `to_dict` as JSON; returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def from_json(cls, path):
        """Read a profile written by `to_json`."""
        return cls.from_dict(json.loads(Path(path).read_text()))
