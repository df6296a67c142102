"""The federation as a service that agent actors consume.

A :class:`~fedmem.federation.engine.Federation` is an in-process object (its shard hosts
are Ray actors, its gateway and accountant live with it). Agent actors are separate
processes, so the session runs the federation inside one Ray actor,
:class:`FederationService`, and hands every agent a :class:`RemoteMemoryClient`: the same
small API as :class:`~fedmem.federation.client.MemoryClient` (``principal``,
``retrieve``, ``epsilon_spent``), forwarding each call with the agent's own principal,
issued by ``Federation.connect()`` inside the service.

Capabilities: ``connect()`` issues a
:class:`~fedmem.federation.gateway.Principal` (random public label, secret 128-bit token);
every agent-facing call takes the *capability*, never a name, and anything the gateway
did not issue gets the uniform refusal (queries) or nothing (spend, bookings). Agents
never hold the :class:`FederationService` handle: they get a :class:`FederationGate`
(in-cluster mode) or the loopback RPC of :mod:`fedmem.agent.isolated` (isolated mode),
which expose exactly ``connect``, ``retrieve`` under a capability, the capability's own
spend and bookings, and the public facts of :meth:`FederationGate.info`. The operator
calls (``audit``, ``ground_truth_many``, ``spent_of`` any label) stay on the service
handle, which only the driver holds. The federation's ledger file is opened only by the
service process and made private to its uid (mode 0600): agents read their own bookings
through the gate. In-cluster, Ray itself confines nothing (docs/agents.md, "What is
enforced where"), so the gate is a narrowing of the API, not an OS boundary.

What an agent can observe is unchanged: a ``Response`` or the uniform
``SupportPrivacyViolation`` (re-raised on the agent's side with only the public query
id, exactly as :func:`fedmem.federation.gateway.refusal` builds it). The gateway books
every release to the principal in the federation's durable store (``ledger_path``)
*before* the response leaves the service, as in process.

:class:`ProjectorService` is the shared nearest-token search of DP-MIND
(``CascadeProjector``): agents send it only the *noisy* embeddings
(``TokenPerturber.noisy_embeddings``, the metric-DP release) and get token ids back,
which is post-processing of that release (papers/002, Theorem 3.3). The clean context
and its token ids never leave the agent; sharing the projector keeps one copy of its
index instead of one per agent process.
"""

from __future__ import annotations

import numpy as np

from fedmem.errors import SupportPrivacyViolation

REFUSED = "__refused__"


class FederationService:
    """Owns one :class:`Federation` and its durable ledger; run as a Ray actor (:func:`start_federation_service`)."""

    def __init__(self, config, data, ledger_path: str, *, accountant_name: str = "federation", seed: int = 0):
        from fedmem.dp import Accountant, DurableStore  # lazy: loads dp_accounting (~210 ms)
        from fedmem.federation.engine import Federation  # lazy: loads dp_accounting (~630 ms)

        self.ledger_path = str(ledger_path)
        self.store = DurableStore(self.ledger_path)
        private_file(self.ledger_path)
        self.fed = Federation(config, data, accountant=Accountant("rdp", store=self.store, name=accountant_name),
                              rng=np.random.default_rng(seed))
        self.accountant_name = accountant_name
        self.busy_s = 0.0
        self.calls = 0

    # ---- what any principal may call (forwarded by FederationGate / the isolated RPC)
    def connect(self):
        """A fresh :class:`~fedmem.federation.gateway.Principal` (label + secret capability)."""
        return self.fed.connect().principal

    def retrieve(self, principal, q, family: str | None = None, retry_of: int | None = None):
        """The ``Response``, or ``(REFUSED, query_id)`` for the uniform refusal (re-raised by the client).

        ``principal``: the capability (a ``Principal`` or its token). Anything else, ``None``
        included, is refused like any other refusal (the query id is still issued)."""
        import time

        t = time.perf_counter()
        self.calls += 1
        if not isinstance(principal, str) or not principal:
            principal = "-"               # never issued: refused uniformly by the gateway
        try:
            return self.fed.retrieve(np.asarray(q, dtype=np.float64), family=family, retry_of=retry_of,
                                     principal=principal)
        except SupportPrivacyViolation as exc:
            return (REFUSED, getattr(exc, "query_id", None))
        finally:
            self.busy_s += time.perf_counter() - t

    def stats(self) -> dict:
        """Retrieve calls and wall seconds spent inside them (the service is serial)."""
        return {"calls": self.calls, "busy_s": self.busy_s}

    def principal_spent(self, principal) -> float:
        """The epsilon booked to the holder of capability ``principal`` (0 for anything unissued)."""
        return float(self.fed.spent(principal))

    def bookings(self, principal) -> list:
        """(event dict, label) of every release booked to capability ``principal`` ([] if unissued)."""
        import json

        label = self.fed.gateway.resolve(principal)
        if label is None:
            return []
        name = f"{self.fed.gateway.accountant.name}/principal/{label}"
        rows = self.store.read("SELECT event, label FROM accountant_events WHERE accountant=? ORDER BY id", (name,))
        return [(json.loads(e), lbl) for e, lbl in rows]

    def public_info(self) -> dict:
        """Public facts of the federation (what an agent may know; no file path)."""
        plan = self.fed.plans["primary"]
        return {"accountant": self.fed.gateway.accountant.name, "delta": self.fed.config.delta,
                "channels": [(c.name, c.kind) for c in getattr(plan, "channels", ())],
                "exact_channels": list(getattr(plan, "exact_channels", ())),
                "bookable": bool(getattr(plan, "bookable", True))}

    # ---- operator / evaluation only (never given to agents)
    def info(self) -> dict:
        """:meth:`public_info` plus the ledger file's path (operator)."""
        return {"ledger_path": self.ledger_path, **self.public_info()}

    def spent_of(self, label: str) -> float:
        """Any principal's booked epsilon by its public label (operator)."""
        return float(self.fed.gateway.principal_spent(str(label)))

    def audit(self) -> list:
        return list(self.fed.audit)

    def ground_truth_many(self, qs) -> list:
        return self.fed.ground_truth_many(np.asarray(qs, dtype=np.float64))

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        self.fed.close()
        self.store.close()


def private_file(path) -> None:
    """Make a SQLite file (and its WAL/SHM siblings, which SQLite creates with the main
    file's mode) readable and writable by its owner only."""
    import os

    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.chmod(f"{path}{suffix}", 0o600)
        except FileNotFoundError:
            pass


class FederationGate:
    """What an agent may call on the federation, and nothing else (a Ray actor in-cluster).

    Holds the :class:`FederationService` handle privately and forwards ``connect``,
    ``retrieve`` under a capability, ``principal_spent`` / ``bookings`` of a capability and
    ``info`` (public facts). No ``audit``, ``ground_truth*``, ``spent_of`` or ledger path.
    """

    def __init__(self, service, timeout_s: float = 300.0):
        self._service = service
        self._timeout_s = float(timeout_s)

    def _get(self, ref):
        import ray

        return ray.get(ref, timeout=self._timeout_s)

    def connect(self):
        return self._get(self._service.connect.remote())

    def retrieve(self, principal, q, family: str | None = None, retry_of: int | None = None):
        return self._get(self._service.retrieve.remote(principal, q, family, retry_of))

    def principal_spent(self, principal) -> float:
        return self._get(self._service.principal_spent.remote(principal))

    def bookings(self, principal) -> list:
        return self._get(self._service.bookings.remote(principal))

    def info(self) -> dict:
        return self._get(self._service.public_info.remote())

    def ping(self) -> bool:
        return True


def start_federation_gate(service, *, num_cpus: float = 0.0, max_concurrency: int = 16):
    """Start a :class:`FederationGate` actor in front of ``service`` (threaded: calls wait on the
    serial service concurrently)."""
    import ray

    h = ray.remote(num_cpus=num_cpus, max_restarts=0, max_concurrency=max_concurrency)(FederationGate).remote(service)
    ray.get(h.ping.remote())
    return h


class RemoteMemoryClient:
    """An agent's handle with its own capability (the ``MemoryClient`` API), over a
    :class:`FederationGate` (agents) or a :class:`FederationService` (operator games)."""

    def __init__(self, service, principal, *, timeout_s: float = 120.0):
        if not isinstance(principal, str) or not principal:
            raise ValueError("principal must be a capability issued by the federation (a Principal or its token). "
                             f"Found {type(principal).__name__}.")
        self._service = service
        self.principal = principal
        self.family = None
        self.timeout_s = float(timeout_s)
        self.responses: list = []
        self.refusals: list = []

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None):
        import ray

        from fedmem.federation.gateway import refusal  # lazy: loads dp_accounting (~390 ms)

        out = ray.get(self._service.retrieve.remote(self.principal, np.asarray(q, dtype=np.float64),
                                                    family or self.family, retry_of), timeout=self.timeout_s)
        if isinstance(out, tuple) and len(out) == 2 and out[0] == REFUSED:
            exc = refusal(out[1])
            self.refusals.append(exc)
            raise exc
        self.responses.append(out)
        return out

    @property
    def epsilon_spent(self) -> float:
        import ray

        return ray.get(self._service.principal_spent.remote(self.principal), timeout=self.timeout_s)

    def bookings(self) -> list:
        """(event dict, label) of every release booked to this capability (read by the service)."""
        import ray

        return ray.get(self._service.bookings.remote(self.principal), timeout=self.timeout_s)


def start_federation_service(config, data, ledger_path, *, accountant_name: str = "federation", seed: int = 0,
                             num_cpus: float = 0.05, cls=None):
    """Start :class:`FederationService` (or the subclass ``cls``) as a Ray actor (Ray must be
    initialised); returns the handle."""
    import ray

    actor = ray.remote(num_cpus=num_cpus, max_restarts=0)(cls or FederationService)
    h = actor.remote(config, data, str(ledger_path), accountant_name=accountant_name, seed=int(seed))
    ray.get(h.ping.remote())
    return h


class ProjectorService:
    """The DP-MIND nearest-token search over noisy embeddings only (a Ray actor)."""

    def __init__(self, projection: str = "cascade", threads: int | None = 1):
        from fedmem.agent.dpmind import load_minilm  # lazy: loads dp_accounting (~370 ms)
        from fedmem.agent.dpmind.perturb import make_projector  # lazy: loads dp_accounting (~480 ms)

        table, _ = load_minilm()
        kw = {} if threads is None else {"threads": threads}
        self.projector = make_projector(table, projection, **kw)
        self.calls = 0
        self.points = 0
        self.busy_s = 0.0
        self.cpu_s = 0.0

    def project(self, points) -> np.ndarray:
        import time

        t, c = time.perf_counter(), time.process_time()
        self.calls += 1
        self.points += int(np.shape(points)[0])
        out = self.projector.project(points)
        self.busy_s += time.perf_counter() - t
        self.cpu_s += time.process_time() - c
        return out

    def stats(self) -> dict:
        """Calls, points projected, wall seconds inside ``project`` and CPU seconds of this process's work."""
        return {"calls": self.calls, "points": self.points, "busy_s": self.busy_s, "cpu_s": self.cpu_s}

    def ping(self) -> bool:
        return True


class RemoteProjector:
    """Projector interface (``table``, ``project``) forwarding noisy points to a :class:`ProjectorService`."""

    name = "remote"

    def __init__(self, service, table, *, timeout_s: float = 120.0):
        self._service = service
        self.table = table
        self.timeout_s = float(timeout_s)

    def project(self, points) -> np.ndarray:
        import ray

        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != self.table.dim:
            raise ValueError(f"points must have shape (n, {self.table.dim}). Found shape {pts.shape}.")
        return np.asarray(ray.get(self._service.project.remote(pts), timeout=self.timeout_s))


def start_projector_service(projection: str = "cascade", *, num_cpus: float = 0.05):
    import ray

    actor = ray.remote(num_cpus=num_cpus, max_restarts=0)(ProjectorService)
    h = actor.remote(projection)
    ray.get(h.ping.remote())
    return h
