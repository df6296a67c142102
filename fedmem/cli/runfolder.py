"""Running a scenario in a run folder: ``--out`` must be new or empty unless ``--resume``, and a
resume must be the same run (:func:`check_out_dir`, :func:`check_resume`); SIGINT/SIGTERM write
the folder with status "interrupted" (:func:`guard_signals`); a run that fails before its first
booking removes what it created (:func:`run_loaded`).

``fedmem.report`` is imported inside the functions, as before the move: it loads numpy
(``import fedmem.report`` ~260-360 ms vs ``import fedmem.cli`` ~35-50 ms before the move,
``python -X importtime``), which ``fedmem list``, ``validate`` and ``--help`` do not need.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fedmem.errors import FedmemError


class UsageError(FedmemError):
    """Bad command-line usage (exit 2), e.g. a non-empty ``--out`` folder without ``--resume``."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run: the run folder is written with status "interrupted"."""

    def __init__(self, signame: str = "SIGINT"):
        super().__init__(signame)
        self.signame = signame


def _on_signal(signum, frame):
    import signal

    raise RunInterrupted(signal.Signals(signum).name)


def guard_signals() -> dict | None:
    """(Re)install fedmem's SIGINT/SIGTERM handlers: they raise :class:`RunInterrupted`, so the run
    folder is written. Ray installs absl's failure handler (which prints a raw stack dump on SIGTERM)
    when it starts; the run context calls this again at every phase and progress bar. Main thread
    only. Returns the handlers it replaced (for :func:`restore_signals`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}


def restore_signals(previous: dict | None) -> None:
    """Put back the handlers :func:`guard_signals` replaced (a run in a longer-lived process, e.g. a
    test or a notebook, leaves the process's signal handling as it found it)."""
    import signal
    import threading

    if not previous or threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse an ``--out`` that is a file, or a non-empty folder unless ``resume``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file, expected a run folder")
    if resume or not out_dir.is_dir():
        return
    entries = sorted(p.name for p in out_dir.iterdir())
    if entries:
        shown = ", ".join(entries[:4]) + (f", ... ({len(entries)} entries)" if len(entries) > 4 else "")
        raise UsageError(
            f"--out {out_dir} is not empty (it holds {shown}); use a new or empty folder, or pass --resume to "
            f"continue there: the run then uses the durable ledgers/accountants already in that folder, so "
            f"budgets already spent stay spent")


def flat_keys(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resume(out_dir: Path, scenario, sha: str, cfg: dict) -> dict | None:
    """The manifest of the run folder ``out_dir`` when ``scenario`` may resume it; :class:`UsageError`
    (exit 2) saying what differs otherwise. None for an empty folder (nothing to resume)."""
    from fedmem.report import read_manifest  # lazy: loads numpy (~410 ms)

    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return None
    manifest = read_manifest(out_dir)
    theirs_cfg = None
    if manifest is None:  # a folder written before run.json existed: its results.json says what ran
        try:
            old = json.loads((out_dir / "results.json").read_text())
            manifest = {"kind": old["kind"], "scenario_sha256": None, "status": "complete", "phases": {}}
            theirs_cfg = old.get("config")
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"--resume: {out_dir} holds no fedmem run (no readable run.json or results.json); "
                             "refusing to book into it") from None
    kind = scenario.experiment.kind
    if manifest.get("kind") != kind:
        raise UsageError(f"--resume: {out_dir} holds a run of kind {manifest.get('kind')!r} "
                         f"({manifest.get('name', '?')}), this scenario is kind {kind!r}; a run folder is one run: "
                         "use a new --out")
    if manifest.get("scenario_sha256") != sha:
        if theirs_cfg is None:
            try:
                import tomllib

                theirs_cfg = tomllib.loads((out_dir / "scenario.resolved.toml").read_text())
            except (OSError, ValueError):
                theirs_cfg = {}
        a, b = flat_keys(theirs_cfg), flat_keys(cfg)
        diff = [k for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]
        if diff or manifest.get("scenario_sha256") is not None:
            shown = "; ".join(f"{k}: {a.get(k, '<absent>')!r} there, {b.get(k, '<absent>')!r} here"
                              for k in diff[:6]) + (f"; ... ({len(diff)} keys)" if len(diff) > 6 else "")
            raise UsageError(f"--resume: {out_dir} holds a different scenario (scenario_sha256 "
                             f"{str(manifest.get('scenario_sha256'))[:12]} there, {sha[:12]} here"
                             + (f"; {shown}" if shown else "") + "); a run folder is one run: use a new --out, "
                             "or resume with the folder's own scenario.resolved.toml")
    return manifest


def _new_out_dir(scenario) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path("runs") / f"{scenario.name}-{stamp}"
    n = 2
    while out_dir.exists():  # a fresh folder per run, even for two runs started in the same second
        out_dir = Path("runs") / f"{scenario.name}-{stamp}-{n}"
        n += 1
    return out_dir


def _remove_created(out_dir: Path, existed: bool) -> None:
    """Remove what a run that booked nothing created in a folder that was empty or absent."""
    import shutil

    if not existed:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    for p in out_dir.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def run_loaded(scenario, out=None, as_json=False, ray_address=None, show_progress=True, resume=False, argv=None):
    """Run an already loaded scenario and write its folder. Returns (payload, result, out_dir).

    The folder holds one run. With ``resume`` it must hold the same kind and scenario hash
    (else :class:`UsageError`); a run interrupted there continues after its completed phases.
    SIGINT/SIGTERM write the folder with status "interrupted" and raise :class:`RunInterrupted`;
    a run that fails before its first booking removes what it created in a new/empty folder.
    """
    from fedmem.report import RunContext, resolved_text, write_manifest  # lazy: loads numpy (~410 ms)

    if out:
        out_dir = Path(out)
        check_out_dir(out_dir, resume)
    else:
        if resume:
            raise UsageError("--resume needs --out <the run folder to continue>")
        out_dir = _new_out_dir(scenario)
    _, sha, cfg = resolved_text(scenario)
    existed = out_dir.is_dir()
    empty_before = not existed or not any(out_dir.iterdir())
    old_manifest = check_resume(out_dir, scenario, sha, cfg) if resume else None
    resumed = old_manifest is not None
    phases = (old_manifest or {}).get("phases") if (old_manifest or {}).get("status") != "complete" else None
    ctx = RunContext(out_dir, scenario.config["seed"], show_progress=show_progress and not as_json,
                     ray_address=ray_address, quiet=as_json, resumed=resumed, phases=phases,
                     figures=scenario.config["figures"])
    ctx.signal_hook = guard_signals
    manifest = dict(old_manifest or {})
    manifest.update(kind=scenario.experiment.kind, name=scenario.name, scenario_sha256=sha, status="running",
                    started=time.strftime("%Y-%m-%dT%H:%M:%S"), argv=list(sys.argv if argv is None else argv),
                    runs=int(manifest.get("runs", 0)) + 1, phases=dict(phases or {}))
    write_manifest(out_dir, manifest)
    previous = guard_signals()
    try:
        return _run_guarded(scenario, ctx, out_dir, existed, empty_before, old_manifest, argv)
    finally:
        restore_signals(previous)


def _run_guarded(scenario, ctx, out_dir, existed, empty_before, old_manifest, argv):
    from fedmem.report import count_bookings, write_manifest, write_run  # lazy: loads numpy (~410 ms)

    t0 = time.perf_counter()
    try:
        result = scenario.experiment.run(scenario.config, ctx)
    except BaseException as exc:
        import signal

        wall = time.perf_counter() - t0
        if isinstance(exc, SystemExit) and exc.code in (signal.SIGTERM, -signal.SIGTERM):
            exc = RunInterrupted("SIGTERM")   # Ray's own SIGTERM handler exits with code 15
        booked = count_bookings(out_dir, ctx.ledger_marks)
        if isinstance(exc, KeyboardInterrupt):
            signame = getattr(exc, "signame", "SIGINT")
            write_run(scenario, ctx, None, wall, status="interrupted", error=f"{signame} received", argv=argv)
            if isinstance(exc, RunInterrupted):
                raise
            raise RunInterrupted(signame) from exc
        if booked == 0 and empty_before:
            _remove_created(out_dir, existed)      # nothing booked: the same --out can be used again
        elif booked == 0 and old_manifest is not None:
            write_manifest(out_dir, old_manifest)  # a failed resume that booked nothing changes nothing
        else:
            msg = " ".join(str(exc).split())
            write_run(scenario, ctx, None, wall, status="failed", error=f"{type(exc).__name__}: {msg}"[:500],
                      argv=argv)
        raise
    wall = time.perf_counter() - t0
    payload = write_run(scenario, ctx, result, wall, argv=argv)
    return payload, result, out_dir
