"""Starting or attaching to Ray, the one way fedmem does it.

A local run starts its **own private** Ray instance with ``ray.init(address="local")``:
Ray's explicit request for a new local instance, so it neither attaches to nor disturbs a
``ray start`` cluster (or ``RAY_ADDRESS``) already on the machine. fedmem stops only what
it started (``ray.shutdown()`` of its own instance), never ``ray stop``. With an address
(``--ray-address auto`` or ``ray://...``) it attaches and leaves the cluster running.

CPU count and object-store size come from the scenario's ``[ray]`` table (``num_cpus``,
``object_store_mb``; 0 means "the machine's CPU count" and "Ray's default"), never a
hard-coded number. ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` is set before Ray starts: it
opts into Ray's future behaviour and silences the FutureWarning Ray prints otherwise
(fedmem uses no accelerators in Ray workers).
"""

from __future__ import annotations

import os


def _ray():
    import ray

    return ray


def local_options(num_cpus: int | None = None, object_store_mb: int | None = None) -> dict:
    """``ray.init`` keyword arguments of a private local instance (machine defaults)."""
    for name, v in (("num_cpus", num_cpus), ("object_store_mb", object_store_mb)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer (0 = default). Found {v!r}.")
    opts = {"address": "local", "num_cpus": num_cpus or (os.cpu_count() or 1), "include_dashboard": False,
            "log_to_driver": False}
    if object_store_mb:
        opts["object_store_memory"] = int(object_store_mb) * 1024 * 1024
    return opts


def ensure_ray(ray_address: str | None = None, *, num_cpus: int | None = None,
               object_store_mb: int | None = None) -> bool:
    """Make sure this process is connected to Ray. Returns True when it started a private
    local instance (the caller then owns it and shuts it down), False when Ray was already
    initialised in this process or an address was given (attach; never shut down)."""
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    ray = _ray()
    if ray.is_initialized():
        return False
    if ray_address is None:
        ray.init(**local_options(num_cpus, object_store_mb))
        return True
    ray.init(address=ray_address, log_to_driver=False)
    return False
