"""``fedmem`` command line: run scenarios, list them, show a kind's keys, run the demo.

Exit codes: 0 success; 1 the run failed (one readable message); 2 invalid scenario or
usage (including a non-empty ``--out`` folder without ``--resume``); 130 interrupted.
Tracebacks are shown only with ``FEDMEM_DEBUG=1``.

The commands are here; running a scenario in a run folder (the ``--out`` / ``--resume`` guards,
signals) is in :mod:`fedmem.cli.runfolder`, the terminal tables in :mod:`fedmem.report.console`.
``fedmem.report`` is imported inside the commands: it loads numpy (``import fedmem.report``
~260-360 ms vs ``import fedmem.cli`` ~35-50 ms before the move, ``python -X importtime``),
which ``fedmem list``, ``validate`` and ``--help`` do not need; :func:`print_table` and
``SHORT_CELL`` stay importable from here through ``__getattr__``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from fedmem import __version__
from fedmem.cli.demo import DEMO_RUNS, DEMO_SIZE, demo_rows  # noqa: F401 - DEMO_SIZE: public name of the CLI
from fedmem.cli.runfolder import RunInterrupted, UsageError, check_out_dir, check_resume, flat_keys, \
    guard_signals, restore_signals, run_loaded
from fedmem.errors import FedmemError, ScenarioError

__all__ = [
    "DEMO_RUNS", "DEMO_SIZE", "RAY_ADDRESS_HELP", "RESUME_HELP", "SCENARIO_DIR", "SHORT_CELL", "RunFailed",
    "RunInterrupted", "UsageError", "build_parser", "check_out_dir", "check_resume", "cmd_compare", "cmd_demo",
    "cmd_list", "cmd_run", "cmd_show", "cmd_validate", "find_scenario", "guard_signals", "main", "print_table",
    "resource_message", "restore_signals", "run_loaded", "run_scenario",
]

_CHECKOUT = Path(__file__).resolve().parent.parent.parent  # a source checkout: its scenarios/ is the source of truth
# An installed wheel has no checkout; its build copied the scenarios into fedmem/_scenarios.
SCENARIO_DIR = (_CHECKOUT / "scenarios" if (_CHECKOUT / "pyproject.toml").is_file()
                else Path(__file__).resolve().parent.parent / "_scenarios")


class RunFailed(FedmemError):
    """A run failed for a reason the CLI explains in one line (exit 1)."""


def __getattr__(name):
    """``fedmem.cli.print_table`` and ``SHORT_CELL``: moved to :mod:`fedmem.report.console`, imported on first use."""
    if name in ("print_table", "SHORT_CELL"):
        from fedmem.report import console  # lazy: loads numpy (~600 ms)

        return getattr(console, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------ running
RESUME_HELP = ("continue a run in an existing --out folder: the run uses the durable ledgers/accountants "
               "already there (ledger.sqlite), so privacy budgets already spent stay spent. Only the same run "
               "resumes (same kind and scenario hash, else exit 2); an interrupted run continues after its "
               "last completed phase")


def find_scenario(arg) -> Path:
    """A scenario file: the path ``arg`` if it exists, else a bundled scenario of that name
    (``dp_demo`` or ``dp_demo.toml``; from the checkout's ``scenarios/`` or the installed wheel's
    ``fedmem/_scenarios``), found from any working directory."""
    path = Path(arg)
    if path.exists():
        return path
    text = str(arg)
    if "/" not in text and os.sep not in text:
        stem = text[:-5] if text.endswith(".toml") else text
        bundled = SCENARIO_DIR / f"{stem}.toml"
        if bundled.is_file():
            return bundled
        import difflib

        names = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
        close = difflib.get_close_matches(stem, names, n=3)
        hint = (f"did you mean {', '.join(close)}? " if close else "") + "`fedmem list` shows the bundled scenarios"
        raise ScenarioError([(text, f"no such file, and no bundled scenario of that name ({hint})")])
    return path  # read_toml reports "no such file"


def run_scenario(path, overrides=(), out=None, as_json=False, ray_address=None, show_progress=True,
                 resume=False):
    """Load, validate, run and write one scenario (a path or a bundled name). Returns (payload, result, out_dir).

    A non-empty ``out`` folder is refused (:class:`UsageError`) unless ``resume``: its
    durable ledgers/accountants would carry over into this run.
    """
    from fedmem.registry import load_scenario  # lazy: ~91 ms, no heavy package

    scenario = load_scenario(find_scenario(path), list(overrides))
    return run_loaded(scenario, out, as_json, ray_address, show_progress, resume)


def _largest_settings(config, n: int = 3) -> str:
    """The scenario's ``n`` largest numeric settings (not the seed), as ``key=value``."""
    found = []

    def walk(d, prefix):
        for k, v in d.items():
            if hasattr(v, "items"):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seed":
                if math.isfinite(v):   # inf means "disabled" (budgets): never a size to reduce
                    found.append((abs(v), f"{prefix}{k}={v!r}"))
            elif isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                   and math.isfinite(x) for x in v):
                found.append((max(abs(x) for x in v), f"{prefix}{k}={v!r}"))

    walk(config, "")
    found.sort(key=lambda t: -t[0])
    return ", ".join(text for _, text in found[:n])


def resource_message(exc: BaseException, config=None) -> str:
    """One readable line for MemoryError / OverflowError / RecursionError."""
    sizes = _largest_settings(config) if config is not None else ""
    where = f" such as {sizes}" if sizes else " (the sizes and counts in the scenario)"
    detail = f": {exc}" if str(exc) else ""
    if isinstance(exc, MemoryError):
        return f"out of memory (MemoryError{detail}) - reduce sizes{where}"
    if isinstance(exc, OverflowError):
        return f"a number grew too large (OverflowError{detail}) - check extreme values{where}"
    if isinstance(exc, RecursionError):
        return f"recursion too deep (RecursionError{detail}) - reduce sizes{where}"
    return f"{type(exc).__name__}{detail}"


def cmd_run(args) -> int:
    from fedmem.registry import load_scenario  # lazy: ~91 ms, no heavy package

    if args.resume and not args.out:
        raise UsageError("--resume needs --out <the run folder to continue>")
    scenario = load_scenario(find_scenario(args.file), list(args.set or []))
    try:
        payload, result, out_dir = run_loaded(scenario, args.out, args.json, args.ray_address, resume=args.resume,
                                              argv=getattr(args, "argv", None))
    except RunInterrupted as exc:
        exc.resume_hint = (f"run folder {args.out or '(see runs/)'} written with status \"interrupted\"; "
                           f"continue with: fedmem run {args.file} --out {args.out or '<that folder>'} --resume")
        raise
    except (MemoryError, OverflowError, RecursionError) as exc:
        raise RunFailed(resource_message(exc, scenario.config)) from exc
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        from rich.text import Text

        from fedmem.report import make_console, print_result_tables  # lazy: loads numpy (~490 ms)

        console = make_console()
        whole = print_result_tables(result, console)
        extra = "" if whole else f"; full tables in {out_dir / 'report.md'}"
        console.print(Text(f"run folder: {out_dir}  (results.json, report.md, {len(payload['figures'])} plot(s)); "
                           f"wall {payload['wall_s']:.1f} s{extra}"), soft_wrap=True)
    return 0 if result.ok else 1


def cmd_validate(args) -> int:
    """Check scenario files (paths or bundled names) without running anything: exit 0 when all are valid."""
    from fedmem.registry import load_scenario  # lazy: ~91 ms, no heavy package

    bad = 0
    for f in args.files:
        try:
            sc = load_scenario(find_scenario(f), list(args.set or []))
        except ScenarioError as exc:
            bad += 1
            print(f"INVALID {f}: {len(exc.problems)} problem(s)")
            for loc, msg in exc.problems:
                print(f"  {loc}: {msg}")
            continue
        print(f"ok      {f} ({sc.experiment.kind}, name {sc.name!r})")
    return 2 if bad else 0


def _bundled_rows(directory: Path):
    from fedmem.scenario import read_toml  # lazy: ~75 ms, no heavy package

    rows = []
    for f in sorted(directory.glob("*.toml")):
        try:
            data = read_toml(f)
            rows.append((f.stem, str(data.get("kind", "?")), " ".join(str(data.get("description", "")).split())))
        except ScenarioError as exc:
            rows.append((f.stem, "INVALID", exc.problems[0][1]))
    return rows


def cmd_list(args) -> int:
    """One line per scenario (name and kind, never cut), its description wrapped below it:
    readable at any width, 80 columns included."""
    import shutil
    import textwrap

    directory = Path(args.dir)
    rows = _bundled_rows(directory)
    if not rows:
        print(f"no scenarios in {directory}", file=sys.stderr)
        return 2
    width = max(40, shutil.get_terminal_size((80, 24)).columns)
    print(textwrap.fill(f"scenarios in {directory} (run one by name: fedmem run NAME; its keys: fedmem show NAME)",
                        width=width - 1, break_long_words=False, break_on_hyphens=False))
    pad = max(len(n) for n, _, _ in rows)
    for name, kind, desc in rows:
        print(f"{name.ljust(pad)}  {kind}")
        if desc:
            print(textwrap.fill(desc, width=width - 1, initial_indent="    ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False))
    return 0


def cmd_show(args) -> int:
    """``fedmem show KIND``: every key of a kind. ``fedmem show SCENARIO`` (a bundled name or a file):
    the scenario's resolved keys (defaults filled in), and where it is."""
    from fedmem.registry import get_experiment, known_kinds, load_scenario  # lazy: ~91 ms, no heavy package
    from fedmem.report import make_console, print_table  # lazy: loads numpy (~490 ms)
    from fedmem.scenario import describe_schema, full_schema  # lazy: ~75 ms, no heavy package

    if args.kind in known_kinds():
        exp = get_experiment(args.kind)
        print_table(make_console(), f"{exp.kind}: {exp.description}", ["key", "type", "default", "meaning"],
                    describe_schema(full_schema(exp)), keep=(0,))
        return 0
    try:
        path = find_scenario(args.kind)
    except ScenarioError:
        path = None
    if path is None or not path.is_file():
        raise ScenarioError([("kind", f"{args.kind!r} is neither an experiment kind ({', '.join(known_kinds())}) "
                                      "nor a scenario file or bundled scenario name (see `fedmem list`)")])
    sc = load_scenario(path, list(getattr(args, "set", None) or []))
    from fedmem.scenario import dump_toml  # lazy: ~38 ms, no heavy package

    def literal(k, v):   # the TOML literal that pastes into --set KEY=VALUE (true/false, inf, quoted strings)
        try:
            return dump_toml({"x": v}).split("=", 1)[1].strip()
        except Exception:  # noqa: BLE001 - a value TOML cannot write (None): say so, never "None"
            return "(unset)"

    rows = [[k, literal(k, v)] for k, v in flat_keys(sc.config.to_dict()).items()]
    print_table(make_console(), f"{sc.name} ({sc.experiment.kind}) from {path}", ["key", "value"], rows, keep=(0,),
                note=f"run it: fedmem run {args.kind}; every key of the kind: fedmem show {sc.experiment.kind}")
    return 0


def _first_sentence(text: str) -> str:
    head, dot, _ = str(text).partition(". ")
    return head + ("." if dot or not head.endswith(".") else "")


def cmd_demo(args) -> int:
    """Run DEMO_RUNS: each setup's attack table (compact at 80 columns; every table is in its
    report.md), then what the adversary got in each, side by side, the rows that differ marked."""
    from rich.text import Text

    from fedmem.report import format_value, make_console, print_table  # lazy: loads numpy (~490 ms)

    console = make_console()
    console.print("[bold]fedmem demo[/bold]: 40 memory shards answer 300 adaptive queries through secure "
                  "aggregation + Gaussian DP (sigma=1.2, delta=1e-6). The DP noise hides the values; the "
                  "question is what the [italic]support[/italic] (which shards took part, how many) gives away.")
    runs, folders = [], []
    for i, (title, fname, overrides) in enumerate(DEMO_RUNS, 1):
        console.rule(f"{i}/{len(DEMO_RUNS)}  {title.split(':', 1)[0]}")
        console.print(Text(title.split(":", 1)[-1].strip()), soft_wrap=False)
        payload, result, out_dir = run_scenario(SCENARIO_DIR / fname, overrides, None, False, args.ray_address)
        for t in result.tables[:1]:   # the attack table; the others are in report.md
            print_table(console, t.title, t.columns, [[format_value(v) for v in row] for row in t.rows],
                        _first_sentence(t.note) if t.note else "", keep=())
        console.print(Text(f"every table and plot: {out_dir / 'report.md'}"), soft_wrap=True)
        runs.append(payload["metrics"])
        folders.append(str(out_dir))
    console.rule("Comparison")
    rows = demo_rows(runs)
    print_table(console, "What the adversary got", [""] + [title.split(":", 1)[0] for title, _, _ in DEMO_RUNS],
                [[label, *cells] for label, cells in rows], keep=(), mark=[len(set(cells)) > 1 for _, cells in rows])
    console.print(
        "Undefended, the exact receipts tell the adversary how many (and which) shards hold memories near its "
        "query, and whether a given record is there, whatever the DP noise on the value. With the gateway, "
        "releases whose support channels cannot be booked are refused before anything is computed, with one "
        "uniform \"no memory available\" that says nothing about the data (the refusal, admission and timing "
        "attacks read it and find nothing). With the broadcast fallback the same queries are answered under the "
        "support-safe broadcast selection: the support attacks fall to chance and every answer is booked.")
    console.print("Reports with plots:")
    for f in folders:
        console.print(Text(f"  {f}"), soft_wrap=True)   # a path is never cut
    return 0


def cmd_compare(args) -> int:
    """Headline metrics and verdicts of several run folders side by side: a table on stdout, and
    compare.md / compare.csv / compare.png / compare.pdf in ``--out`` (default runs/compare-<time>)."""
    import csv

    from fedmem.figures import compare_figure  # lazy: loads numpy (~310 ms)
    from fedmem.report import compare_runs, format_value, make_console, print_table, to_jsonable  # lazy: loads numpy (~490 ms)

    try:
        cmp = compare_runs([Path(d) for d in args.run_dirs], all_metrics=args.all)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out_dir = Path(args.out) if args.out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = compare_figure(out_dir, cmp["runs"], cmp["numeric"])
    cells = [[format_value(v) if not isinstance(v, (list, dict)) else json.dumps(v) for v in row]
             for row in cmp["rows"]]
    with open(out_dir / "compare.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["key", *cmp["runs"]])
        w.writerows(cells)
    md = ["# fedmem compare", "", "| key | " + " | ".join(cmp["runs"]) + " |", "|---" * (len(cmp["runs"]) + 1) + "|"]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    md += ["", f"Run folders: {', '.join(str(d) for d in args.run_dirs)}"]
    if fig is not None:
        md += ["", "![compare](compare.png)"]
    (out_dir / "compare.md").write_text("\n".join(md) + "\n")
    if args.json:
        print(json.dumps(to_jsonable({**cmp, "out": str(out_dir)}), indent=2))
        return 0
    note = (f"{cmp['omitted']} more metric(s) not shown (--all shows them). " if cmp["omitted"] else "") + \
        f"Written: {out_dir}/compare.md, compare.csv" + (", compare.png, compare.pdf" if fig is not None else "")
    print_table(make_console(), "Runs side by side", ["key", *cmp["runs"]], cells, note=note, keep=(0,))
    return 0


RAY_ADDRESS_HELP = ("attach to this Ray cluster (auto, ray://host:port or host:port; 'local' = a private local "
                    "instance). Default: $RAY_ADDRESS when set (as ray.init() and `ray job submit` entrypoints "
                    "use it), else a private local instance, even beside a running `ray start` cluster")

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedmem", description="Federated agent memory under DP, and attacks on it.")
    p.add_argument("--version", action="version", version=f"fedmem {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="validate and run one scenario (a file or a bundled name such as dp_demo)")
    r.add_argument("file", help="scenario TOML file (scenarios/support_leak_40.toml) or the name of a bundled "
                                "scenario (dp_demo; see `fedmem list`)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key (TOML literal), repeatable: --set federation.shards=100")
    r.add_argument("--out", help="run folder (default runs/<name>-<timestamp>); must be new or empty "
                                 "unless --resume is given")
    r.add_argument("--resume", action="store_true", help=RESUME_HELP)
    r.add_argument("--json", action="store_true", help="print results.json to stdout; no progress bars")
    r.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    r.set_defaults(func=cmd_run)
    v = sub.add_parser("validate", help="check scenario files (or bundled names) without running them; "
                                        "exit 0 when all are valid, 2 otherwise")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--set", action="append", metavar="KEY=VALUE", help="override applied to every file")
    v.set_defaults(func=cmd_validate)
    ls = sub.add_parser("list", help="list the bundled scenarios (name, kind, description)")
    ls.add_argument("--dir", default=str(SCENARIO_DIR if SCENARIO_DIR.is_dir() else "scenarios"))
    ls.set_defaults(func=cmd_list)
    sh = sub.add_parser("show", help="show every key of an experiment kind (dp.demo), or the resolved keys "
                                     "of a scenario (dp_demo or a file)")
    sh.add_argument("kind", metavar="KIND_OR_SCENARIO")
    sh.set_defaults(func=cmd_show)
    c = sub.add_parser("compare", help="headline metrics and verdicts of several run folders side by side "
                                       "(table, compare.csv/.md and one figure)")
    c.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    c.add_argument("--out", help="folder for compare.md/.csv/.png/.pdf (default runs/compare-<timestamp>)")
    c.add_argument("--all", action="store_true", help="show every metric, not only the first 40")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.set_defaults(func=cmd_compare)
    d = sub.add_parser("demo", help="run the main demo (what `make demo` runs)")
    d.add_argument("--ray-address", help=RAY_ADDRESS_HELP)
    d.set_defaults(func=cmd_demo)
    from fedmem.cli.hunt import add_parser as _add_hunt  # fedmem hunt (fedmem/cli/hunt.py)

    _add_hunt(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = ["fedmem", *argv] if argv is not None else list(sys.argv)
    debug = os.environ.get("FEDMEM_DEBUG") == "1"
    hint = "(FEDMEM_DEBUG=1 shows the traceback)"
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"fedmem: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"fedmem: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        import signal

        signame = getattr(exc, "signame", "SIGINT")
        extra = getattr(exc, "resume_hint", None)
        print("fedmem: interrupted" + (f" ({signame}); {extra}" if extra else ""), file=sys.stderr)
        return 128 + int(getattr(signal, signame, signal.SIGINT))
    except RunFailed as exc:
        if debug:
            raise
        print(f"fedmem: run failed: {exc} {hint}", file=sys.stderr)
        return 1
    except (MemoryError, OverflowError, RecursionError) as exc:
        if debug:
            raise
        print(f"fedmem: run failed: {resource_message(exc)} {hint}", file=sys.stderr)
        return 1
    except (FedmemError, ValueError, TypeError, OSError, RuntimeError, TimeoutError) as exc:
        if debug:
            raise
        print(f"fedmem: run failed: {type(exc).__name__}: {exc} {hint}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug: still one readable line, the traceback on request
        if debug:
            raise
        msg = " ".join(str(exc).split())
        print(f"fedmem: run failed: internal error {type(exc).__name__}{': ' + msg if msg else ''} {hint}",
              file=sys.stderr)
        return 1

