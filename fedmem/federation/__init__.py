"""Federated retrieval: shard hosts, MPC compute parties, aggregator, gateway, engine.

Imports are lazy so that ``fedmem.federation.shard_host`` and ``fedmem.federation.sharing``
(loaded inside numpy-only shard-host actors) never pull in torch or CrypTen.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Federation": "engine", "FederationConfig": "config", "Response": "engine", "Truth": "compute",
    "Engine": "compute", "Computation": "compute", "CapabilityService": "client",
    "AuditRecord": "engine", "MemoryClient": "client", "Gateway": "gateway", "Aggregator": "aggregator",
    "ReleasePolicy": "aggregator", "Release": "aggregator", "Channel": "aggregator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"fedmem.federation.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fedmem.federation' has no attribute {name!r}")
