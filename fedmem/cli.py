"""``fedmem`` command line: run scenarios, list them, show a kind's keys, run the demo.

Exit codes: 0 success; 1 the run failed (one readable message); 2 invalid scenario or
usage; 130 interrupted. Tracebacks are shown only with ``FEDMEM_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from fedmem.errors import FedmemError, ScenarioError

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _print_tables(result, console) -> None:
    from rich.table import Table as RichTable

    from fedmem.report import _fmt

    for t in result.tables:
        rt = RichTable(title=t.title, title_justify="left")
        for c in t.columns:
            rt.add_column(str(c))
        for row in t.rows:
            rt.add_row(*[_fmt(v) for v in row])
        console.print(rt)
        if t.note:
            console.print(f"[dim]{t.note}[/dim]")


def run_scenario(path, overrides=(), out=None, as_json=False, ray_address=None, show_progress=True):
    """Load, validate, run and write one scenario. Returns (payload, result, out_dir)."""
    from fedmem.report import RunContext, write_run
    from fedmem.scenario import load_scenario

    scenario = load_scenario(path, list(overrides))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if out:
        out_dir = Path(out)
    else:  # a fresh folder per run, even for two runs started in the same second
        out_dir = Path("runs") / f"{scenario.name}-{stamp}"
        n = 2
        while out_dir.exists():
            out_dir = Path("runs") / f"{scenario.name}-{stamp}-{n}"
            n += 1
    ctx = RunContext(out_dir, scenario.config["seed"], show_progress=show_progress and not as_json,
                     ray_address=ray_address, quiet=as_json)
    t0 = time.perf_counter()
    result = scenario.experiment.run(scenario.config, ctx)
    wall = time.perf_counter() - t0
    payload = write_run(scenario, ctx, result, wall)
    return payload, result, out_dir


def cmd_run(args) -> int:
    payload, result, out_dir = run_scenario(args.file, args.set or [], args.out, args.json, args.ray_address)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        console = _console()
        _print_tables(result, console)
        console.print(f"run folder: {out_dir}  (results.json, report.md, "
                      f"{len(payload['figures'])} plot(s)); wall {payload['wall_s']:.1f} s")
    return 0 if result.ok else 1


def cmd_list(args) -> int:
    from fedmem.scenario import read_toml

    directory = Path(args.dir)
    files = sorted(directory.glob("*.toml"))
    if not files:
        print(f"no scenarios in {directory}", file=sys.stderr)
        return 2
    from rich.table import Table as RichTable

    table = RichTable(title=f"scenarios in {directory}", title_justify="left")
    table.add_column("file")
    table.add_column("kind")
    table.add_column("description")
    for f in files:
        try:
            data = read_toml(f)
            table.add_row(f.name, str(data.get("kind", "?")), str(data.get("description", "")))
        except ScenarioError as exc:
            table.add_row(f.name, "INVALID", exc.problems[0][1])
    _console().print(table)
    return 0


def cmd_show(args) -> int:
    from rich.table import Table as RichTable

    from fedmem.registry import get_experiment, known_kinds
    from fedmem.scenario import describe_schema, full_schema

    try:
        exp = get_experiment(args.kind)
    except KeyError:
        raise ScenarioError([("kind", f"unknown experiment {args.kind!r} (one of: {', '.join(known_kinds())})")])
    table = RichTable(title=f"{exp.kind}: {exp.description}", title_justify="left")
    for c in ("key", "type", "default", "meaning"):
        table.add_column(c)
    for row in describe_schema(full_schema(exp)):
        table.add_row(*row)
    _console().print(table)
    return 0


# The demo: what `make demo` runs. Each entry is (title, scenario file, overrides).
DEMO_RUNS = [
    ("Undefended: exact receipts leave with every DP answer (papers/003)", "support_leak_40.toml", []),
    ("Gateway: the same federation behind the support-leak gateway", "support_leak_40_gateway.toml", []),
    ("Gateway + re-run: refused queries re-run under support-safe broadcast", "support_leak_40_gateway.toml",
     ['federation.on_reject="rerun_broadcast"', 'name="support_leak_40_gateway_rerun"']),
]


def cmd_demo(args) -> int:
    """Run DEMO_RUNS and print what the adversary got in each, side by side."""
    from rich.table import Table as RichTable

    def _demo_rows(runs) -> list[tuple[str, list[str]]]:
        """Comparison rows (label, one cell per run) from the runs' metrics."""
        def get(m, *path, default=None):
            for p in path:
                if not isinstance(m, dict) or p not in m:
                    return default
                m = m[p]
            return m

        def num(x, fmt="{:.3g}"):
            if x is None:
                return "-"
            if isinstance(x, str):
                return x
            if isinstance(x, float) and x != x:
                return "n/a"
            return fmt.format(x)

        rows = []
        rows.append(("queries answered / refused",
                     [f"{get(m, 'forwarded', default='-')} / {get(m, 'rejected', default='-')}" for m in runs]))
        rows.append(("contributing shards guessed within +-2 (papers/003: 94%)",
                     [num(get(m, "reconstruction", "rate"), "{:.0%}") for m in runs]))
        rows.append(("  ... a constant guess would get",
                     [num(get(m, "reconstruction", "chance_rate"), "{:.0%}") for m in runs]))
        rows.append(("membership attack AUC (0.5 = coin flip)",
                     [num(get(m, "differencing", "auc"), "{:.2f}") for m in runs]))
        rows.append(("  ... leak proven (epsilon lower bound, 95%)",
                     [num(get(m, "differencing", "eps_lower"), "{:.2f}") for m in runs]))
        rows.append(("  ... epsilon booked for that query",
                     [num(get(m, "booked_epsilon_per_query"), "{:.2f}") for m in runs]))
        rows.append(("support-leaky answers that reached the agent",
                     [num(get(m, "forwarded_leaky"), "{}") for m in runs]))
        rows.append(("answers with a channel the accountant does not cover",
                     [num(get(m, "forwarded_unbooked"), "{}") for m in runs]))
        rows.append(("total epsilon booked (all channels emitted)",
                     [num(get(m, "epsilon_spent_total"), "{:.3g}") for m in runs]))
        rows.append(("utility: MSE of released mean vs exact mean",
                     [num(get(m, "utility_mse"), "{:.3g}") for m in runs]))
        return rows

    console = _console()
    console.print("[bold]fedmem demo[/bold]: 40 memory shards answer 300 adaptive queries through secure "
                  "aggregation + Gaussian DP (sigma=1.2, delta=1e-6). The DP noise hides the values; the "
                  "question is what the [italic]support[/italic] (which shards took part, how many) gives away.")
    runs, folders = [], []
    for i, (title, fname, overrides) in enumerate(DEMO_RUNS, 1):
        console.rule(f"{i}/{len(DEMO_RUNS)}  {title}")
        payload, result, out_dir = run_scenario(SCENARIO_DIR / fname, overrides, None, False, args.ray_address)
        _print_tables(result, console)
        console.print(f"run folder: {out_dir}")
        runs.append(payload["metrics"])
        folders.append(str(out_dir))
    console.rule("Comparison")
    table = RichTable(title="What the adversary got", title_justify="left")
    table.add_column("")
    for title, _, _ in DEMO_RUNS:
        table.add_column(title.split(":", 1)[0])
    for label, cells in _demo_rows(runs):
        table.add_row(label, *cells)
    console.print(table)
    console.print(
        "Undefended, the exact receipts tell the adversary how many (and which) shards hold memories near its "
        "query, and whether a given record is there, whatever the DP noise on the value. With the gateway, "
        "responses whose support is not covered by the accountant are refused (\"no memory available\"), "
        "and what was emitted before the refusal is still booked. With the re-run, refused queries are answered "
        "again under the support-safe broadcast selection: the support attacks fall to chance and the values "
        "stay DP. Reports with plots: " + ", ".join(folders))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedmem", description="Federated agent memory under DP, and attacks on it.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="validate and run one scenario file")
    r.add_argument("file", help="scenario TOML file, e.g. scenarios/support_leak_40.toml")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key (TOML literal), repeatable: --set federation.shards=100")
    r.add_argument("--out", help="run folder (default runs/<name>-<timestamp>)")
    r.add_argument("--json", action="store_true", help="print results.json to stdout; no progress bars")
    r.add_argument("--ray-address", help="attach to an existing Ray cluster instead of starting a local one")
    r.set_defaults(func=cmd_run)
    ls = sub.add_parser("list", help="list scenario files with their one-line descriptions")
    ls.add_argument("--dir", default=str(SCENARIO_DIR if SCENARIO_DIR.is_dir() else "scenarios"))
    ls.set_defaults(func=cmd_list)
    sh = sub.add_parser("show", help="show every key of an experiment kind, with defaults and meaning")
    sh.add_argument("kind")
    sh.set_defaults(func=cmd_show)
    d = sub.add_parser("demo", help="run the main demo (what `make demo` runs)")
    d.add_argument("--ray-address", help="attach to an existing Ray cluster")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    debug = os.environ.get("FEDMEM_DEBUG") == "1"
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"fedmem: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedmem: interrupted", file=sys.stderr)
        return 130
    except (FedmemError, ValueError, TypeError, OSError, RuntimeError, TimeoutError) as exc:
        if debug:
            raise
        print(f"fedmem: run failed: {type(exc).__name__}: {exc} (FEDMEM_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
