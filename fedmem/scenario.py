"""Scenario files: schema, loading, validation, overrides.

A scenario is one TOML file under ``scenarios/``. Its top-level ``kind`` names a
registered experiment (``"<family>.<name>"``, e.g. ``"federation.support_leak"``); every
experiment declares a schema of nested sections of :class:`Param`. Loading reports
**every** problem at once (unknown keys, missing keys, wrong types, impossible values,
cross-field conflicts) as a :class:`~fedmem.errors.ScenarioError` with file and key.
:func:`fedmem.registry.load_scenario` reads a file and looks its kind up (it lives beside the
registry, so this module never imports the registry: no scenario -> registry -> experiments
-> scenario cycle); this module holds the schema, the validation and the overrides it uses.

Every scenario also has the common keys ``kind``, ``name``, ``description`` and
``seed`` (the seed of every RNG in the run, so a run is reproducible).

``--set section.key=value`` overrides take TOML literals (``3``, ``1e-6``, ``"x"``,
``true``, ``[1, 2]``); a bare word that is not a TOML literal is taken as a string.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from fedmem.errors import ScenarioError

# Param and the reusable checks live in fedmem.params (one source of truth shared with the
# configuration dataclasses); re-exported here for experiment modules.
from fedmem.params import (  # noqa: F401
    REQUIRED, Param, at_least, between, each, nonempty, nonempty_each, nonnegative, open_unit, positive)


def safe_name(v) -> str | None:
    """A run-folder name: no path separators, not "." or ".." (the folder must stay under runs/)."""
    seps = [c for c in ("/", "\\", os.sep, os.altsep) if c]
    if any(c in v for c in seps):
        return f"must not contain a path separator ('/' or '\\'), found {v!r}"
    if v in (".", ".."):
        return f"must not be '.' or '..', found {v!r}"
    if "\x00" in v:
        return f"must not contain a NUL character, found {v!r}"
    return None


Schema = Mapping[str, "Param | Schema"]

COMMON_SCHEMA: dict[str, Param] = {
    "kind": Param(str, help="registered experiment, e.g. 'federation.support_leak' (see `fedmem list`)"),
    "name": Param(str, "", check=safe_name,
                  help="short name used for the run folder (default: file stem); no '/' or '\\', not '.' or '..'"),
    "description": Param(str, "", help="one line shown by `fedmem list`"),
    "seed": Param(int, 0, help="seed of every RNG in the run", check=nonnegative),
    "figures": Param(bool, True, help="draw the run's figures (300-dpi PNG + vector PDF, about 2 s for an 8-curve "
                     "ROC figure on 2 cores); false skips the drawing (report.md and results.json list each as skipped; CSVs "
                     "of plotted data are still written), e.g. for sweeps and tests"),
    "ray": {
        "num_cpus": Param(int, 0, help="CPUs of the private local Ray instance (0 = the machine's count); "
                          "ignored with --ray-address", check=nonnegative),
        "object_store_mb": Param(int, 0, help="object store of the local Ray instance in MiB (0 = Ray's default)",
                                 check=nonnegative),
    },
}


@dataclass(frozen=True)
class Experiment:
    """A registered experiment kind: schema + run function (+ cross-field checks)."""

    kind: str
    description: str
    schema: Schema
    run: Callable[["Config", Any], Any]
    cross_checks: Callable[["Config"], list[tuple[str, str]]] | None = None
    # Up-front memory estimate: (key, what with the real sizes, bytes) per large allocation;
    # load_scenario refuses one that cannot fit, naming the key, before anything runs.
    memory: Callable[["Config"], list[tuple[str, str, float]]] | None = None


class Config(Mapping):
    """Read-only nested config with attribute access: ``cfg.federation.shards``."""

    def __init__(self, data: Mapping[str, Any]):
        self._data = {k: Config(v) if isinstance(v, Mapping) else v for k, v in data.items()}

    def __getitem__(self, key):
        return self._data[key]

    def __getattr__(self, key):
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(key) from None

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, Config) else v for k, v in self._data.items()}

    def __repr__(self) -> str:
        return f"Config({self.to_dict()!r})"


@dataclass
class Scenario:
    path: Path
    experiment: Experiment
    config: Config
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.config["name"] or self.path.stem


# ---------------------------------------------------------------- validation
def validate_data(data: Mapping, schema: Schema, prefix: str, problems: list, out: dict) -> None:
    """Check ``data`` against ``schema`` (recursively), appending ``(key, message)`` to ``problems``
    and the coerced values (defaults filled in) to ``out``."""
    for key in data:
        if key not in schema:
            known = ", ".join(sorted(schema)) or "(none)"
            problems.append((prefix + key, f"unknown key (known here: {known})"))
    for key, spec in schema.items():
        loc = prefix + key
        if isinstance(spec, Mapping):
            sub = data.get(key, {})
            if not isinstance(sub, Mapping):
                problems.append((loc, f"must be a table [{loc}], found {type(sub).__name__}"))
                continue
            out[key] = {}
            validate_data(sub, spec, loc + ".", problems, out[key])
            continue
        if key not in data:
            if spec.required:
                problems.append((loc, f"missing required key ({spec.help or spec.type_name()})"))
            else:
                out[key] = spec.default
            continue
        value = data[key]
        msg = spec.problem(value)
        if msg:
            problems.append((loc, msg))
            continue
        out[key] = spec.coerce(value)
        msg = _magnitude_problem(out[key])
        if msg:
            problems.append((loc, msg))


# Finite numbers above this magnitude overflow the computations they feed (sensitivities
# 2*clip/n, squared errors, exp(eps)) long after validation; no fedmem setting needs them.
# ``inf`` stays allowed where a key accepts it ("disabled"), so does any integer that
# fits the sizes checked by the experiment's own cross-checks.
MAX_MAGNITUDE = 1e30


def _magnitude_problem(value) -> str | None:
    import math

    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, float) and math.isfinite(v) and abs(v) > MAX_MAGNITUDE:
            return (f"{v!r} is too large: finite values above {MAX_MAGNITUDE:g} overflow later computations "
                    "(use inf where the key allows it)")
    return None


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ValueError("expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ValueError("expected key=value with a dotted key such as federation.shards")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str], problems: list) -> dict:
    for text in overrides:
        try:
            path, value = _parse_override(text)
        except ValueError as exc:
            problems.append((f"--set {text}", str(exc)))
            continue
        node = data
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                problems.append((f"--set {text}", f"{part!r} is not a table"))
                break
            node = nxt
        else:
            node[path[-1]] = value
    return data


def full_schema(experiment: Experiment) -> dict:
    schema = dict(COMMON_SCHEMA)
    for k, v in experiment.schema.items():
        if k in schema:
            raise RuntimeError(f"experiment {experiment.kind!r} redefines common key {k!r}")
        schema[k] = v
    return schema


def read_toml(path: Path) -> dict:
    """Parse a TOML file; a syntax error becomes a ScenarioError naming the file."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError([(str(path), "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError([(str(path), "is a directory, expected a .toml file")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError([(str(path), f"not valid TOML: {exc}")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError([(str(path), f"not UTF-8 text: {exc}")]) from None


def memory_problems(estimates) -> list[tuple[str, str]]:
    """Problems for the estimated allocations ``(key, what, bytes)`` that cannot fit in memory."""
    from fedmem import _validate as V  # lazy: loads numpy (~230 ms)

    out = []
    for key, what, nbytes in estimates:
        msg = V.memory_problem(what, float(nbytes))
        if msg:
            out.append((key, msg))
    return out


def describe_schema(schema: Schema, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (key, type, default, help) for documentation and `fedmem show`."""
    rows = []
    for key, spec in schema.items():
        if isinstance(spec, Mapping):
            rows += describe_schema(spec, prefix + key + ".")
        else:
            default = "(required)" if spec.required else repr(spec.default)
            extra = f" One of {list(spec.choices)}." if spec.choices else ""
            if extra and spec.help and not spec.help.endswith("."):
                extra = "." + extra
            rows.append((prefix + key, spec.type_name(), default, (spec.help + extra).strip()))
    return rows


def _plain(data: Mapping) -> dict:
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def dump_toml(data: Mapping) -> str:
    """TOML text of a resolved scenario, written by ``tomli_w`` (so any string round-trips).

    ``tomllib.loads(dump_toml(d)) == d`` for every scenario value: strings (control
    characters, quotes, backslashes, any unicode), numbers, booleans, lists, nested tables.
    A ``None`` value has no TOML form and raises ``TypeError`` naming the key.
    """
    import tomli_w

    def check(d: Mapping, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, Mapping):
                check(v, f"{prefix}{k}.")
            elif v is None:
                raise TypeError(f"{prefix}{k} is None, which TOML cannot write")

    check(data, "")
    return tomli_w.dumps(_plain(data))
