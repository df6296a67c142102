"""Phase state and the run manifest (``run.json``): what a phase saves when it completes, and
what a resumed run restores (``fedmem run --resume``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from fedmem.report.results import Table


def stable_json(v) -> str:
    return json.dumps(plain_state(v), sort_keys=True, allow_nan=True)


def plain_state(obj):
    """JSON-ready copy of phase state: numpy to Python, tables tagged, inf/nan kept as floats."""
    if isinstance(obj, Table):
        return {"__table__": plain_state(obj.to_dict())}
    if isinstance(obj, dict):
        return {str(k): plain_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_state(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain_state(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def revive_state(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__table__"}:
            return Table(**obj["__table__"])
        return {k: revive_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [revive_state(v) for v in obj]
    return obj


def merge_metrics(metrics: dict, saved: dict) -> None:
    """Merge ``saved`` into ``metrics`` in place (nested dicts updated, so aliases stay valid)."""
    for k, v in saved.items():
        if isinstance(v, dict) and isinstance(metrics.get(k), dict):
            merge_metrics(metrics[k], v)
        else:
            metrics[k] = v


# ---------------------------------------------------------------- run manifest (run.json)
MANIFEST = "run.json"


def read_manifest(out_dir: Path) -> dict | None:
    """The run folder's ``run.json`` (kind, scenario hash, status, completed phases), or None."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(out_dir: Path, data: dict) -> None:
    """Write ``run.json`` atomically (a crash leaves the old or the new one, never half)."""
    path = Path(out_dir) / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(plain_state(data), indent=1, allow_nan=True) + "\n")
    os.replace(tmp, path)
