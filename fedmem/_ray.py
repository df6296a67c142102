"""Starting or attaching to Ray, the one way fedmem does it.

Which Ray a run uses, in order (what ``ray.init()`` users expect, with one exception):

1. an explicit address (``--ray-address``, ``ray_address=``): ``auto``, ``ray://...`` or
   ``host:port`` attaches to that cluster and leaves it running; ``local`` starts a
   private instance (Ray's own spelling);
2. else ``RAY_ADDRESS`` from the environment, exactly as ``ray.init()`` reads it. This is
   how a ``ray job submit ... -- fedmem run ...`` entrypoint finds its cluster (the job
   supervisor sets ``RAY_ADDRESS``), and the job's ``runtime_env`` (``working_dir``) then
   carries fedmem's code to every worker (docs/cluster.md, "Ray Jobs");
3. else a **private** local instance, ``ray.init(address="local")``. The exception to
   ``ray.init()``: fedmem does not auto-join a ``ray start`` cluster it merely finds on the
   machine (``/tmp/ray/ray_current_cluster``); it neither attaches to nor disturbs it.
   Attach with ``--ray-address auto``.

fedmem stops only what it started (``ray.shutdown()`` of its own instance), never
``ray stop``. CPU count and object-store size of a private instance come from the
scenario's ``[ray]`` table (``num_cpus``, ``object_store_mb``; 0 means "the machine's CPU
count" and "Ray's default"), never a hard-coded number; an attached cluster keeps its own.

Start-up of the private instance: ``include_dashboard=False`` and ``log_to_driver=False``;
and, through :func:`lean_private_head` (Ray 2.55 offers the first two as ``ray start`` flags
and ``RayParams`` fields, not as ``ray.init`` arguments), no autoscaler monitor (a private
instance has fixed local resources: nothing to scale), no log monitor (with
``log_to_driver=False`` nothing reads what it publishes; worker logs stay in the session's
``logs/`` folder), no dashboard head (without a dashboard Ray would start it with its
usage-stats module only, and wait for it) and a dashboard agent that sends its node reports
every 10 minutes instead of every 5 s (they feed a dashboard that is not there). Measured
side by side (``scripts/bench_ray_start.py``, docs/cluster.md): ``ray.init`` 3.6 vs 6.4 s,
half the CPU at start and when idle. The raylet still starts its dashboard agent and
runtime-env agent (it exits when either dies).
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` is set before Ray starts: it opts into Ray's
future behaviour and silences the FutureWarning Ray prints otherwise (fedmem uses no
accelerators in Ray workers).
"""

from __future__ import annotations

import contextlib
import logging
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
            "log_to_driver": False, "logging_level": logging.WARNING}   # no "Started a local Ray instance" INFO line
    if object_store_mb:
        opts["object_store_memory"] = int(object_store_mb) * 1024 * 1024
    return opts


def resolve_address(ray_address: str | None = None) -> str | None:
    """The address a run attaches to: the explicit one, else ``RAY_ADDRESS``, else None
    (a private local instance). ``"local"`` (explicit or in ``RAY_ADDRESS``) means None."""
    if ray_address is not None and (not isinstance(ray_address, str) or not ray_address.strip()):
        raise ValueError(f"ray_address must be a non-empty string (auto, ray://host:port, host:port or local). "
                         f"Found {ray_address!r}.")
    address = ray_address if ray_address is not None else (os.environ.get("RAY_ADDRESS") or "").strip() or None
    return None if address == "local" else address


def kill_actor(actor) -> None:
    """``ray.kill(actor, no_restart=True)``, quietly: an actor that is already gone (or a Ray that
    is gone) is not an error for the teardown paths that call this."""
    try:
        _ray().kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead
        pass


# The environment of a private instance's raylet and of the agents it starts: the dashboard
# agent's reporter module collects and sends node statistics every REPORTER_UPDATE_INTERVAL_MS
# (Ray's default 5,000 ms: ~1 s of CPU per minute with 8 actors on this 2-core machine).
QUIET_AGENT_ENV = {"REPORTER_UPDATE_INTERVAL_MS": "600000"}


@contextlib.contextmanager
def lean_private_head():
    """While active, a head node that ``ray.init`` starts in this process gets
    ``no_monitor=True``, ``include_log_monitor=False`` and :data:`QUIET_AGENT_ENV` for its raylet,
    and, when no dashboard was asked for (``include_dashboard=False``), no dashboard head process
    (Ray starts it with its usage-stats module only and waits up to ~1.6 s for it; without it the
    node is in the state Ray accepts when that optional server fails to start: no web UI URL).

    A wrapper around ``ray._private.node.Node.__init__`` (what ``ray.init`` calls with the
    ``RayParams`` it built), restored on exit; nodes that only connect (``head=False``:
    attaching to a cluster) are untouched; so is ``Node.start_api_server``, wrapped the same way.
    ``tests/test_ray_coexist.py`` checks that a private instance runs without the two monitors
    and the dashboard head, so a Ray upgrade that moves these internals fails that test instead
    of silently starting them again."""
    from ray._private import node as ray_node

    original = ray_node.Node.__init__

    def init(self, ray_params, *args, **kwargs):
        if kwargs.get("head", args[0] if args else False):
            ray_params.no_monitor = True
            ray_params.include_log_monitor = False
            ray_params.env_vars = {**(ray_params.env_vars or {}), **QUIET_AGENT_ENV}
        original(self, ray_params, *args, **kwargs)

    original_api = ray_node.Node.start_api_server

    def api_server(self, *, include_dashboard, raise_on_failure):
        if include_dashboard:           # a dashboard was asked for: Ray's own start
            return original_api(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
        self._webui_url = None          # Ray's state when its optional API server did not start
        return None

    ray_node.Node.__init__ = init
    ray_node.Node.start_api_server = api_server
    try:
        yield
    finally:
        ray_node.Node.__init__ = original
        ray_node.Node.start_api_server = original_api


def ensure_ray(ray_address: str | None = None, *, num_cpus: int | None = None,
               object_store_mb: int | None = None) -> bool:
    """Make sure this process is connected to Ray. Returns True when it started a private
    local instance (the caller then owns it and shuts it down), False when Ray was already
    initialised in this process or it attached to a cluster (``ray_address``, else
    ``RAY_ADDRESS``; never shut down). ``ray_address="local"`` forces a private instance."""
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    ray = _ray()
    if ray.is_initialized():
        return False
    address = resolve_address(ray_address)
    if address is None:
        with lean_private_head():
            ray.init(**local_options(num_cpus, object_store_mb))
        return True
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)   # no "Connecting to ..." INFO
    return False
