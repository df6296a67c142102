"""What an experiment returns and what ``results.json`` holds: :class:`Table`, :class:`Result`,
the cell format of tables (:func:`format_value`), :func:`to_jsonable`, the schema of results.json
and :func:`load_results` (a run folder's results.json)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np


@dataclass
class Table:
    title: str
    columns: Sequence[str]
    rows: list[Sequence[Any]]
    note: str = ""

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        out.append("| " + " | ".join(map(str, self.columns)) + " |")
        out.append("|" + "---|" * len(self.columns))
        for row in self.rows:
            out.append("| " + " | ".join(format_value(v) for v in row) + " |")
        if self.note:
            out += ["", self.note]
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows],
                "note": self.note}


@dataclass
class Result:
    """What an experiment returns. ``metrics`` must be JSON-serialisable (numpy ok)."""

    metrics: dict
    tables: list[Table] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, markdown)
    ok: bool = True


def format_value(v) -> str:
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ---------------------------------------------------------------- results.json schema
RESULTS_SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "results.schema.json"


def results_schema() -> dict:
    """The JSON Schema (draft 2020-12) of results.json, shipped in the package."""
    return json.loads(RESULTS_SCHEMA.read_text())


def load_results(run_dir: Path) -> dict:
    """The ``results.json`` of a run folder (ValueError naming the folder when missing or unreadable)."""
    path = Path(run_dir) / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"run_dir must be a fedmem run folder holding results.json. Found {str(run_dir)!r} "
                         "(no results.json)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"results.json of {str(run_dir)!r} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"results.json of {str(run_dir)!r} must hold a JSON object. Found {type(data).__name__}.")
    return data
