"""One source of truth for a knob: its type, default, bounds and help text.

A :class:`Param` describes one key. The same object validates a scenario file's value
(:mod:`fedmem.scenario`, every problem collected with file and key), is printed by
``fedmem show``, and validates the Python API: a configuration dataclass declares its
fields with :func:`knob`, calls :func:`check_knobs` in ``__post_init__`` (``ValueError``
naming the field and the value found), and its scenario section is derived from the
class with :func:`schema_of`, so keys, defaults, bounds and help are written once.

Stdlib only: importing this module starts nothing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """One key: type, default (omit for required), help, and checks.

    ``check(value)`` returns an error message or ``None``. ``choices`` restricts the
    value to a set. ``float`` keys accept integers. ``type=list`` keys may give
    ``item_type`` for their elements. ``allow_inf`` lets a float key be ``inf`` (TOML
    ``inf``), e.g. a budget that is explicitly disabled.
    """

    type: type | tuple[type, ...] = float
    default: Any = REQUIRED
    help: str = ""
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None
    item_type: type | None = None
    allow_inf: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        names = {float: "number", int: "integer", str: "string", bool: "boolean", list: "list", dict: "table"}
        return " or ".join(names.get(t, t.__name__) for t in types)

    def type_ok(self, value) -> bool:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        for t in types:
            if t is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
                return True
            if t is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return True
            if t not in (float, int) and isinstance(value, t):
                return True
        return False

    def problem(self, value) -> str | None:
        """Why ``value`` is not acceptable (a message naming the value), or ``None``."""
        if not self.type_ok(value):
            noun = self.type_name()
            article = "an " if noun[:1] in "aeiou" else "a "
            return f"must be {article}{noun}, found {value!r} ({type(value).__name__})"
        if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
            v = float(value)
            if math.isnan(v) or (math.isinf(v) and not (self.allow_inf and v > 0)):
                return f"must be finite, found {value!r}"
        if self.item_type is not None and isinstance(value, (list, tuple)):
            item = Param(self.item_type)
            bad = [v for v in value if not item.type_ok(v)]
            if bad:
                return f"items must be {item.type_name()}, found {bad[0]!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {list(self.choices)}, found {value!r}"
        if self.check is not None:
            return self.check(value)
        return None

    def coerce(self, value):
        """A valid value in its canonical Python type (an integer given for a float key becomes a float)."""
        if self.type is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if self.type is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        return value


# ---------------------------------------------------------------- reusable checks
def positive(v) -> str | None:
    return None if v > 0 else f"must be positive, found {v!r}"


def nonnegative(v) -> str | None:
    return None if v >= 0 else f"must be non-negative, found {v!r}"


def open_unit(v) -> str | None:
    return None if 0 < v < 1 else f"must be in the open interval (0, 1), found {v!r}"


def at_least(n) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}, found {v!r}"


def between(lo, hi) -> Callable[[Any], str | None]:
    """Closed interval ``[lo, hi]``."""
    return lambda v: None if lo <= v <= hi else f"must be in [{lo}, {hi}], found {v!r}"


def each(check) -> Callable[[Any], str | None]:
    def run(values):
        for i, v in enumerate(values):
            msg = check(v)
            if msg:
                return f"item {i}: {msg}"
        return None

    return run


def nonempty(v) -> str | None:
    return None if len(v) > 0 else "must not be empty"


def nonempty_each(check) -> Callable[[Any], str | None]:
    """A non-empty list whose every item passes ``check``."""
    return lambda values: nonempty(values) or each(check)(values)


# ---------------------------------------------------------------- dataclass knobs
def knob(default, help: str, *, type=None, **param) -> Any:
    """A dataclass field whose :class:`Param` (type, default, bounds, help) lives in its metadata.

    ``type`` defaults to the default's own type (``int``, ``float``, ``str``, ``bool``);
    ``default=REQUIRED`` makes a field without a default (``type`` then given explicitly).
    """
    if default is REQUIRED:
        if type is None:
            raise TypeError("knob(REQUIRED, ...) needs an explicit type")
        return dataclasses.field(metadata={"param": Param(type, REQUIRED, help, **param)})
    t = type if type is not None else default.__class__
    return dataclasses.field(default=default, metadata={"param": Param(t, default, help, **param)})


def params_of(cls) -> dict[str, Param]:
    """The :class:`Param` of every :func:`knob` field of a dataclass, in declaration order."""
    return {f.name: f.metadata["param"] for f in dataclasses.fields(cls) if "param" in f.metadata}


def check_knobs(obj) -> None:
    """Validate every knob of a dataclass instance; ``ValueError`` names the field and the value."""
    for name, p in params_of(obj).items():
        msg = p.problem(getattr(obj, name))
        if msg:
            raise ValueError(f"{name} {msg}")


def schema_of(cls, *, required=(), drop=(), defaults=None) -> dict[str, Param]:
    """A scenario section derived from a dataclass's knobs.

    ``required``: keys a scenario file must state (the dataclass keeps its safe default
    for Python callers, but a file that omits a key deciding privacy is refused);
    ``drop``: knobs a scenario does not expose; ``defaults``: scenario defaults that differ
    from the dataclass's (e.g. smaller sizes).
    """
    params = params_of(cls)
    unknown = (set(required) | set(drop) | set(defaults or {})) - set(params)
    if unknown:
        raise KeyError(f"{cls.__name__} has no knobs {sorted(unknown)}")
    out = {}
    for name, p in params.items():
        if name in drop:
            continue
        if name in required:
            p = dataclasses.replace(p, default=REQUIRED, help="required: " + p.help)
        elif defaults and name in defaults:
            p = dataclasses.replace(p, default=defaults[name])
        out[name] = p
    return out
