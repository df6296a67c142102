"""Comparing run folders: headline metrics and verdicts of several runs side by side
(``fedmem compare``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from fedmem.report.results import load_results


HEADLINE_KEYS = ("status", "kind", "name", "seed", "overrides", "scenario_sha256", "wall_s", "verdict",
                 "ledger bookings (this run)")


def _scalars(d: dict, prefix: str = "", depth: int = 3) -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if depth > 1:
                out.update(_scalars(v, key + ".", depth - 1))
        elif isinstance(v, bool) or v is None:
            out[key] = v
        elif isinstance(v, (int, float)):
            out[key] = v
        elif isinstance(v, str) and len(v) <= 60:
            out[key] = v
    return out


def compare_runs(run_dirs: Sequence[Path], *, all_metrics: bool = False, limit: int = 40) -> dict:
    """Headline metrics and verdicts of several run folders side by side.

    Returns ``{"runs": [labels], "rows": [[key, value per run...]], "numeric": {key: [values]},
    "omitted": n}``. Rows: the run's identity (status, kind, name, seed, overrides, scenario
    hash, wall time), every verdict, the bookings this run made, then the metrics (flattened
    to ``a.b.c``): those that differ between runs first, at most ``limit`` unless ``all_metrics``.
    """
    datas = [load_results(d) for d in run_dirs]
    labels = []
    for d, data in zip(run_dirs, datas):
        label = Path(d).name or str(d)
        n = 2
        while label in labels:
            label = f"{Path(d).name} ({n})"
            n += 1
        labels.append(label)
    head, metr = [], []
    for data in datas:
        m = data.get("metrics") or {}
        flat = _scalars(m)
        ledgers = data.get("ledgers") or []
        head.append({
            "status": data.get("status", "complete (older run folder)"), "kind": data.get("kind"),
            "name": data.get("name"), "seed": data.get("seed"), "overrides": " ".join(data.get("overrides") or []) or "-",
            "scenario_sha256": str((data.get("provenance") or {}).get("scenario_sha256") or "-")[:12],
            "wall_s": data.get("wall_s"),
            "verdict": m.get("verdict", "-"),
            "ledger bookings (this run)": sum(int(r.get("bookings_this_run") or 0) for r in ledgers) if ledgers else "-",
        })
        metr.append(flat)
    rows = [[k, *[h.get(k) for h in head]] for k in HEADLINE_KEYS]
    keys = []
    for flat in metr:
        keys += [k for k in flat if k not in keys]
    keys = [k for k in keys if f"attacks.{k}" not in keys]   # metrics[name] mirrors metrics["attacks"][name]
    verdicts = [k for k in keys if k.endswith("verdict") and k != "verdict"]
    rest = [k for k in keys if k not in verdicts and k != "verdict"]

    def differs(k):
        vals = [json.dumps(f.get(k), sort_keys=True, default=str) for f in metr]
        return len(set(vals)) > 1

    rest.sort(key=lambda k: (not differs(k), keys.index(k)))
    shown = rest if all_metrics else rest[:limit]
    for k in verdicts + shown:
        rows.append([k, *[f.get(k, "-") for f in metr]])
    numeric = {}
    for k in ["wall_s"] + shown:
        vals = [h.get(k) if k == "wall_s" else f.get(k) for h, f in zip(head, metr)]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals if v is not None) and \
                sum(v is not None for v in vals) >= 1 and any(v is not None for v in vals):
            numeric[k] = vals
    # the figure: headline metrics (epsilon, AUC, rates, errors) shared by most runs and differing
    # between them first; bookkeeping (phase times, budgets) last, wall time at the end
    words = ("eps", "auc", "tpr", "rate", "mse", "rmse", "spent", "released", "refused", "error", "subem", "f1")

    def rank(k):
        present = sum(v is not None for v in numeric[k])
        book = k.startswith(("phase_seconds.", "budgets.")) or k == "wall_s"
        return (book, -present, not any(w in k.lower() for w in words), not differs(k), keys.index(k)
                if k in keys else len(keys))

    numeric = {k: numeric[k] for k in sorted(numeric, key=rank)}
    return {"runs": labels, "rows": rows, "numeric": numeric, "omitted": len(rest) - len(shown)}
