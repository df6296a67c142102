"""Event (de)serialisation: a booked event as the JSON object stored in the SQLite ledgers.

:func:`event_to_dict` / :func:`event_from_dict` (also reads the legacy ``{"type": ...}``
rows). The stored format is fixed: rows already written must read back identically.
"""

from __future__ import annotations

import dataclasses
import json

import attr
import dp_accounting

from fedmem.dp.mechanisms import ApproxDpEvent, PureDpEvent

# ------------------------------------------------------------------ event (de)serialisation
# dp-accounting 0.6.0 serialises events only to / from NamedTuples
# (``DpEvent.to_named_tuple`` / ``DpEvent.from_named_tuple``), not to dicts or JSON. A row
# is that named tuple as a JSON object: ``{"module_name", "class_name", <fields>}``, nested
# events likewise. fedmem's own records (``PureDpEvent``, ``ApproxDpEvent``; plain
# dataclasses, not attrs classes) use the same shape. ``from_named_tuple`` imports whatever
# module a row names, so rows are checked against an allow-list first.
_FEDMEM_MODULE = "fedmem.dp.mechanisms"
_FEDMEM_EVENTS = {"PureDpEvent": PureDpEvent, "ApproxDpEvent": ApproxDpEvent}
_DPA_MODULE = "dp_accounting.dp_event"
_LEGACY_TYPES = ("pure", "approx", "gaussian", "laplace", "self_composed", "composed")

_CHECKED_CLASSES: set = set()


def _to_json(value):
    """A field value as stored: events as their dicts, sequences as lists, the rest as is."""
    if isinstance(value, (PureDpEvent, ApproxDpEvent)):
        return event_to_dict(value)
    if isinstance(value, dp_accounting.DpEvent):
        return _dp_event_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _dp_event_to_dict(event) -> dict:
    """What ``_tuple_to_json(event.to_named_tuple())`` gives, without building a named-tuple
    class per call (``typing.NamedTuple`` runs ``eval``: ~0.3 ms, thousands of times per run,
    and no memo helps a ``ComposedDpEvent``: its list makes it unhashable). The same
    pass over ``attr.fields`` in order: ``{"module_name", "class_name", <fields>}``, nested
    events likewise, sequences as lists (tested equal to dp-accounting's path on every
    event kind fedmem books)."""
    cls = type(event)
    if cls not in _CHECKED_CLASSES:
        dp_accounting.dp_event._check_attrs_cls_for_known_errors(cls)   # what to_named_tuple checks first
        _CHECKED_CLASSES.add(cls)
    out = {"module_name": cls.__module__, "class_name": cls.__name__}
    for f in attr.fields(cls):
        value = getattr(event, f.name)
        if isinstance(value, dict):   # no fedmem event has one: dp-accounting's own path
            return _tuple_to_json(event.to_named_tuple())
        out[f.name] = _to_json(value)
    return out


def _tuple_to_json(value):
    if isinstance(value, (PureDpEvent, ApproxDpEvent)):
        return event_to_dict(value)
    if isinstance(value, tuple) and "class_name" in getattr(value, "_fields", ()):
        # a DpEventNamedTuple (the duck test its runtime Protocol performs, without typing's
        # per-call protocol introspection)
        return {k: _tuple_to_json(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_tuple_to_json(v) for v in value]
    return value


def event_to_dict(event) -> dict:
    """JSON-ready dict of ``event`` (any dp-accounting event, or a fedmem pure/approx record).

    dp-accounting events as ``DpEvent.to_named_tuple`` lays them out (:func:`_dp_event_to_dict`);
    the result names the event's module and class. Anything else raises ``TypeError``.
    """
    if isinstance(event, (PureDpEvent, ApproxDpEvent)):
        return {"module_name": _FEDMEM_MODULE, "class_name": type(event).__name__, **dataclasses.asdict(event)}
    if isinstance(event, dp_accounting.DpEvent):
        return _dp_event_to_dict(event)
    raise TypeError(f"event must be a dp_accounting.DpEvent, PureDpEvent or ApproxDpEvent. "
                    f"Found {type(event).__name__}.")


def _legacy_from_dict(d: dict):
    """Rows written before events were stored as dp-accounting named tuples."""
    t = d["type"]
    if t == "pure":
        return PureDpEvent(epsilon=d["epsilon"], mechanism=d.get("mechanism", "pure"))
    if t == "approx":
        return ApproxDpEvent(epsilon=d["epsilon"], delta=d["delta"], mechanism=d.get("mechanism", "approx"))
    if t == "gaussian":
        return dp_accounting.GaussianDpEvent(d["noise_multiplier"])
    if t == "laplace":
        return dp_accounting.LaplaceDpEvent(d["noise_multiplier"])
    if t == "self_composed":
        return dp_accounting.SelfComposedDpEvent(event_from_dict(d["event"]), d["count"])
    if t == "composed":
        return dp_accounting.ComposedDpEvent([event_from_dict(e) for e in d["events"]])
    raise ValueError(f"event type must be one of {'/'.join(_LEGACY_TYPES)}. Found {t!r}.")


def _json_to_value(value):
    if isinstance(value, dict):
        return event_from_dict(value)
    if isinstance(value, list):
        return [_json_to_value(v) for v in value]
    return value


_FROM_MEMO: dict = {}


def event_from_text(text: str):
    """The event of a stored row (its JSON text), memoised by that exact text.

    A ledger holds the same few events thousands of times, and building one costs ~0.2 ms
    (dp-accounting's runtime-Protocol checks); every sync of every accountant reads rows
    back. Events are immutable records (frozen attrs / frozen dataclasses; a
    ``ComposedDpEvent``'s list is only read by the accountants), so one object per text is
    shared; equal text gives an equal event, as :func:`event_from_dict` would build it."""
    got = _FROM_MEMO.get(text)
    if got is None:
        got = _build_from_dict(json.loads(text))
        if len(_FROM_MEMO) < 4096:
            _FROM_MEMO[text] = got
    return got


def event_from_dict(d: dict):
    """Inverse of :func:`event_to_dict`; also reads rows in the older ``{"type": ...}`` form."""
    if not isinstance(d, dict):   # not a row: _build_from_dict names the problem
        return _build_from_dict(d)
    try:
        text = json.dumps(d)
    except (TypeError, ValueError):   # not a stored row's shape: build it (and fail) without the memo
        return _build_from_dict(d)
    return event_from_text(text)


def _build_from_dict(d: dict):
    if not isinstance(d, dict):
        raise ValueError(f"event must be a dict. Found {d!r}.")
    if "type" in d and "class_name" not in d:
        return _legacy_from_dict(d)
    module, name = d.get("module_name"), d.get("class_name")
    fields = {k: _json_to_value(v) for k, v in d.items() if k not in ("module_name", "class_name")}
    if module == _FEDMEM_MODULE and name in _FEDMEM_EVENTS:
        try:
            return _FEDMEM_EVENTS[name](**fields)
        except TypeError as exc:
            raise ValueError(f"event fields of {name} must be {_FEDMEM_EVENTS[name].__dataclass_fields__.keys()}. "
                             f"Found {sorted(fields)}.") from exc
    cls = getattr(dp_accounting.dp_event, name, None) if module == _DPA_MODULE and isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
        raise ValueError(f"event module_name/class_name must name a dp_accounting.dp_event event or a fedmem "
                         f"PureDpEvent/ApproxDpEvent. Found {module!r}/{name!r}.")
    # What dp-accounting's own ``DpEvent.from_named_tuple`` does once the nested events are
    # built (they are, by _json_to_value): import the named module, take the class, call it
    # with the fields. The module and class are checked above (allow-list).
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"event fields of {name} must be its attrs fields. Found {sorted(fields)}.") from exc


# ------------------------------------------------------------------ Gaussian DP of an event
def gaussian_mu(event) -> float | None:
    """``mu`` such that ``event`` (a dp-accounting event or its stored dict) is exactly ``mu``-GDP
    (Dong, Roth and Su 2022), or ``None`` when it is not a composition of Gaussian releases only.

    A Gaussian release with noise multiplier ``z`` (noise std / L2 sensitivity, dp-accounting's
    convention) is ``1/z``-GDP, and GDP composes exactly: ``mu = sqrt(sum mu_i^2)``. A
    ``NoOpDpEvent`` is 0-GDP. Any other event (Laplace, pure, sampled, ...) has no exact GDP
    curve here: ``None``, so callers fall back to (epsilon, delta) tests."""
    ev = event_from_dict(event) if isinstance(event, dict) else event
    if isinstance(ev, dp_accounting.GaussianDpEvent):
        z = float(ev.noise_multiplier)
        return 1.0 / z if z > 0 else float("inf")
    if isinstance(ev, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(ev, dp_accounting.SelfComposedDpEvent):
        mu = gaussian_mu(ev.event)
        return None if mu is None else mu * float(ev.count) ** 0.5
    if isinstance(ev, dp_accounting.ComposedDpEvent):
        mus = [gaussian_mu(e) for e in ev.events]
        return None if any(m is None for m in mus) else float(sum(m * m for m in mus)) ** 0.5
    return None
