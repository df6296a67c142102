"""``fedmem hunt``: search a scenario's system for a distinguishing attack (docs/hunt.md).

    fedmem hunt SCENARIO [--set k=v ...] [--budget-s N] [--seed S] --out DIR
    fedmem hunt --replay DIR/results.json [--pairs N]

Writes ``DIR/results.json`` (top-level ``"verdict"``: ``LEAK`` / ``within booked`` /
``no leak seen``; the strongest attack as a replayable recipe; power; every hypothesis tried)
and ``DIR/hunt.png`` (the strongest attack's held-out ROC under the DP ceiling of what was
booked). Progress goes to stderr.

Exit codes: 0 no leak shown (``within booked`` or ``no leak seen``); 3 ``LEAK``; 2 a usage or
scenario error (one line); 1 the hunt itself failed (one line).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LEAK = 0, 1, 2, 3


def add_parser(sub) -> None:
    h = sub.add_parser("hunt", help="search a scenario's system for a distinguishing attack (docs/hunt.md); "
                                    "exit 3 on LEAK, 0 otherwise")
    h.add_argument("file", nargs="?", help="scenario TOML file (federation.*, flower.* or agents.* kind)")
    h.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a scenario key, repeatable")
    h.add_argument("--budget-s", type=float, default=60.0, help="wall-clock budget of the search (default 60)")
    h.add_argument("--seed", type=int, default=0, help="seed of the hunt (worlds, splits, classifier)")
    h.add_argument("--alpha", type=float, default=0.05, help="family-wise level over every hypothesis (0.05)")
    h.add_argument("--out", help="folder for results.json and hunt.png (new or empty)")
    h.add_argument("--replay", metavar="RESULTS_JSON", help="re-run the strongest recipe of a results.json")
    h.add_argument("--pairs", type=int, help="--replay: trial pairs to play (default: the recipe's)")
    h.set_defaults(func=cmd_hunt)


def _usage(msg: str) -> int:
    print(f"fedmem hunt: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _load(ref: dict):
    from fedmem.registry import load_scenario

    sc = load_scenario(ref["path"], ref.get("overrides") or [])
    return sc.config["kind"], sc.config.to_dict()


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            return _json_safe(x.item())
        except (ValueError, AttributeError):
            return repr(x)
    return x


def _figure(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from sklearn.metrics import roc_curve

    from fedmem.attacks.audit import dp_roc_ceiling

    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    st, roc = res.get("strongest"), res.get("roc")
    if st and roc and roc.get("pos") and roc.get("neg"):
        y = np.r_[np.ones(len(roc["pos"])), np.zeros(len(roc["neg"]))]
        fpr, tpr, _ = roc_curve(y, np.r_[roc["pos"], roc["neg"]])
        ax.plot(fpr, tpr, label=f"hunter (held out), AUC {st.get('test_auc', 0.5):.3f}")
        b = st["booked"]
        f = np.linspace(0, 1, 201)
        ax.plot(f, dp_roc_ceiling(f, b["eps"], b["delta"]), "--", label=f"DP ceiling, eps {b['eps']:.2f} booked")
        ax.set_title(st["arm"][:60], fontsize=7)
    ax.plot([0, 1], [0, 1], ":", color="grey")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"fedmem hunt: {res['verdict']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def cmd_hunt(args) -> int:
    from fedmem.errors import ScenarioError
    from fedmem.hunt.runner import hunt, replay

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.replay:
        if args.file:
            return _usage("give either SCENARIO or --replay RESULTS_JSON, not both")
        p = Path(args.replay)
        try:
            res = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            return _usage(f"--replay must be a readable results.json. Found {args.replay!r} ({type(exc).__name__})")
        try:
            out = replay(res, _load, pairs=args.pairs, alpha=args.alpha, progress=say)
        except ScenarioError as exc:
            return _usage(str(exc))
        print(json.dumps(_json_safe(out), indent=1))
        return EXIT_LEAK if out["verdict"] == "LEAK" else EXIT_OK
    if not args.file:
        return _usage("a SCENARIO file (or --replay RESULTS_JSON) is required")
    if not args.out:
        return _usage("--out DIR is required")
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        return _usage(f"--budget-s must be a positive number of seconds. Found {args.budget_s!r}")
    if not 0 < args.alpha < 1:
        return _usage(f"--alpha must be in (0, 1). Found {args.alpha!r}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return _usage(f"--out must be a new or empty folder. Found {str(out)!r} (not empty)")
    ref = {"path": str(args.file), "overrides": list(args.set or [])}
    try:
        kind, cfg = _load(ref)
    except ScenarioError as exc:
        return _usage(str(exc))
    try:
        res = hunt(kind, cfg, budget_s=args.budget_s, seed=args.seed, alpha=args.alpha,
                   scenario_ref=ref, progress=say)
    except ValueError as exc:
        return _usage(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    res["scenario"] = ref
    _figure(res, out / "hunt.png")
    (out / "results.json").write_text(json.dumps(_json_safe(res), indent=1))
    st = res.get("strongest") or {}
    say(f"hunt: {res['verdict']}; strongest: {st.get('arm')}: {(st.get('verdict') or {}).get('text')}")
    print(res["verdict"])
    return EXIT_LEAK if res["verdict"] == "LEAK" else EXIT_OK
