"""Everything observable, captured and featurised generically.

:func:`capture` runs one call the adversary can make and records what comes back: the
result, or the exception (type, text, text length, attributes, the chain of causes), and
whether and when it came (wall and CPU time). :func:`flatten` turns any result (dataclass,
mapping, sequence, numpy array, scalar, text, exception) into named leaves. A
:class:`Featuriser` maps each leaf to numbers without knowing what it means:

* numbers and arrays: the first :data:`MAX_COORDS` values, their length, shape, dtype,
  mean, L2 norm, and **float bit features** (the number of trailing zero bits of each
  coordinate's mantissa, its minimum over the array, and the low 8 mantissa bits of the
  first coordinate): a float sampler's output is visible there;
* texts: a stable hash (so equal texts give equal numbers), the length, the digits count
  and the first number in the text (a count or value written into a message);
* missing / None leaves: NaN (the classifier treats it as its own value);
* for every numeric array leaf, a **learned projection** on the difference of the two
  worlds' mean vectors on the training split (a linear discriminant: the adversary knows
  both worlds and learns the direction from data, whatever the field).

Nothing here knows a field name of any fedmem type: new fields are featurised as they
appear.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from typing import Callable

import numpy as np

MAX_COORDS = 16
"""Coordinates of an array kept as separate features (the rest enter through the summaries)."""

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def capture(fn: Callable[[], object]) -> dict:
    """Run ``fn`` once: ``{"ok", "result" | "exc", "wall_s", "cpu_s"}`` (every exception is caught:
    whether an answer comes is itself an observation)."""
    c0, t0 = time.thread_time(), time.perf_counter()
    try:
        out = fn()
        ok, exc = True, None
    except Exception as e:  # noqa: BLE001 - the adversary observes every exception
        out, ok, exc = None, False, e
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"ok": ok, "result": out, "exc": None if exc is None else exception_view(exc), "wall_s": wall,
            "cpu_s": cpu}


def exception_view(exc: BaseException, depth: int = 0) -> dict:
    """What a caller sees of an exception: type, text, text length, public attributes, its cause chain."""
    text = str(exc)
    attrs = {}
    for k, v in sorted(getattr(exc, "__dict__", {}).items()):
        if not k.startswith("_"):
            attrs[k] = v
    view = {"type": type(exc).__name__, "text": text, "text_len": len(text), "args_len": len(exc.args),
            "attrs": attrs}
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None and depth < 3:
        view["cause"] = exception_view(cause, depth + 1)
    return view


def flatten(obj, prefix: str = "", out: dict | None = None, depth: int = 0) -> dict:
    """Named leaves of ``obj``: ``{"a.b[0].c": leaf}`` with leaves numbers, numpy arrays, texts or None."""
    out = {} if out is None else out
    if depth > 8:
        out[prefix] = repr(type(obj))
        return out
    if obj is None or isinstance(obj, (bool, int, float, str, np.integer, np.floating, bytes)):
        out[prefix] = obj.hex() if isinstance(obj, bytes) else obj
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biuf":
            out[prefix] = obj
        else:
            out[prefix] = repr(obj.tolist())[:2000]
    elif isinstance(obj, BaseException):
        flatten(exception_view(obj), prefix, out, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            flatten(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name, out, depth + 1)
    elif isinstance(obj, dict):
        out[f"{prefix}#keys"] = ",".join(sorted(map(str, obj)))
        for k in sorted(obj, key=str):
            flatten(obj[k], f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        out[f"{prefix}#len"] = len(obj)
        if obj and all(isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) for x in obj):
            out[prefix] = np.asarray(obj, dtype=np.float64)
        else:
            for i, x in enumerate(obj[:32]):
                flatten(x, f"{prefix}[{i}]", out, depth + 1)
    elif hasattr(obj, "__dict__"):
        out[f"{prefix}#type"] = type(obj).__name__
        for k, v in sorted(vars(obj).items()):
            if not k.startswith("_"):
                flatten(v, f"{prefix}.{k}" if prefix else k, out, depth + 1)
    else:
        out[prefix] = repr(obj)[:2000]
    return out


def text_hash(s: str) -> float:
    return float(int.from_bytes(hashlib.blake2b(s.encode("utf-8", "replace"), digest_size=4).digest(), "big"))


def _trailing_zeros(a: np.ndarray) -> np.ndarray:
    """Trailing zero bits of each float64's 52-bit mantissa (52 for exact zeros/integers of few bits)."""
    bits = np.ascontiguousarray(a, dtype=np.float64).view(np.uint64) & np.uint64((1 << 52) - 1)
    tz = np.full(bits.shape, 52, dtype=np.int64)
    nz = bits != 0
    if np.any(nz):
        b = bits[nz]
        low = b & (~b + np.uint64(1))            # lowest set bit
        tz[nz] = np.log2(low.astype(np.float64)).astype(np.int64)
    return tz


def leaf_features(name: str, v) -> dict[str, float]:
    """Numbers for one leaf (module docstring)."""
    f: dict[str, float] = {}
    if v is None:
        f[f"{name}:none"] = 1.0
        return f
    if isinstance(v, (bool, np.bool_)):
        f[name] = float(v)
        return f
    if isinstance(v, str):
        f[f"{name}:hash"] = text_hash(v)
        f[f"{name}:len"] = float(len(v))
        f[f"{name}:digits"] = float(sum(c.isdigit() for c in v))
        m = _NUM.search(v)
        f[f"{name}:num"] = float(m.group(0)) if m else math.nan
        return f
    a = np.asarray(v)
    f[f"{name}:size"] = float(a.size)
    f[f"{name}:ndim"] = float(a.ndim)
    f[f"{name}:dtype"] = text_hash(str(a.dtype))
    if a.ndim:
        f[f"{name}:shape"] = text_hash(str(a.shape))
    x = a.astype(np.float64).ravel()
    fin = np.isfinite(x)
    f[f"{name}:nonfinite"] = float(x.size - fin.sum())
    xf = np.where(fin, x, 0.0)
    for i in range(min(MAX_COORDS, x.size)):
        f[f"{name}[{i}]"] = float(xf[i])
    if x.size:
        f[f"{name}:mean"] = float(xf.mean())
        f[f"{name}:norm"] = float(np.sqrt(np.sum(xf * xf)))
        if a.dtype.kind == "f":
            tz = _trailing_zeros(xf)
            f[f"{name}:tz_min"] = float(tz.min())
            f[f"{name}:tz_mean"] = float(tz.mean())
            f[f"{name}:low8"] = float(int(xf[:1].view(np.uint64)[0]) & 0xFF)
    return f


def observation_leaves(obs: dict) -> dict:
    """Named leaves of one captured observation (:func:`capture`) or a sequence's dict of them."""
    return flatten(obs)


def precompute(leaves: dict) -> tuple[dict, dict]:
    """One trial's leaves as ``(feature row, numeric array leaves)``: computed once, when the trial is played."""
    row: dict[str, float] = {}
    arrays: dict[str, np.ndarray] = {}
    for k, v in leaves.items():
        row.update(leaf_features(k, v))
        if isinstance(v, np.ndarray) and v.dtype.kind in "biuf" and v.size > 1:
            arrays[k] = np.nan_to_num(v.astype(np.float64).ravel(), nan=0.0, posinf=0.0, neginf=0.0)
    return row, arrays


class Featuriser:
    """Fixed feature columns learned from a training split (module docstring). Input: the
    :func:`precompute` d trials."""

    def __init__(self, max_features: int = 300):
        self.max_features = int(max_features)
        self.columns: list[str] = []
        self.projections: dict[str, np.ndarray] = {}

    def fit(self, trials: list[tuple[dict, dict]], y: np.ndarray) -> "Featuriser":
        rows = [t[0] for t in trials]
        cols: dict[str, int] = {}
        for r in rows:
            for k in r:
                cols[k] = cols.get(k, 0) + 1
        keep = []
        sample = rows[:300]
        for k in sorted(cols, key=lambda c: (-cols[c], c)):
            first = sample[0].get(k, math.nan)
            varies = cols[k] != len(rows) or any(
                (r.get(k, math.nan) != first) and not (math.isnan(first) and math.isnan(r.get(k, math.nan)))
                for r in sample)
            if varies:
                keep.append(k)
        self.columns = keep[: self.max_features]
        y = np.asarray(y)
        self.projections = {}
        names: dict[str, int] = {}
        for _, arrs in trials:
            for k, a in arrs.items():
                names.setdefault(k, a.size)
        for k, size in names.items():
            idx = [i for i, (_, arrs) in enumerate(trials) if k in arrs and arrs[k].size == size]
            if len(idx) < 4:
                continue
            lab = y[idx]
            if lab.min() == lab.max():
                continue
            mat = np.stack([trials[i][1][k] for i in idx])
            d = mat[lab == 1].mean(axis=0) - mat[lab == 0].mean(axis=0)
            nd = np.linalg.norm(d)
            if nd > 0 and np.isfinite(nd):
                self.projections[k] = d / nd
        return self

    def transform(self, trials: list[tuple[dict, dict]]) -> np.ndarray:
        X = np.full((len(trials), len(self.columns) + len(self.projections)), np.nan)
        index = {c: j for j, c in enumerate(self.columns)}
        for i, (r, _) in enumerate(trials):
            for k, val in r.items():
                j = index.get(k)
                if j is not None:
                    X[i, j] = val
        base = len(self.columns)
        for j, (k, d) in enumerate(sorted(self.projections.items())):
            for i, (_, arrs) in enumerate(trials):
                a = arrs.get(k)
                if a is not None and a.size == d.size:
                    X[i, base + j] = float(a @ d)
        # a signed log: monotone per column (trees and thresholds see the same order), finite and binnable
        X = np.clip(X, -1e300, 1e300)
        return np.sign(X) * np.log1p(np.abs(X))

    @property
    def names(self) -> list[str]:
        return self.columns + [f"{k}:proj" for k in sorted(self.projections)]
