"""The federation as a service that agent actors consume (issue 11).

A :class:`~fedmem.federation.engine.Federation` is an in-process object (its shard hosts
are Ray actors, its gateway and accountant live with it). Agent actors are separate
processes, so the session runs the federation inside one Ray actor,
:class:`FederationService`, and hands every agent a :class:`RemoteMemoryClient`: the same
small API as :class:`~fedmem.federation.client.MemoryClient` (``principal``,
``retrieve``, ``epsilon_spent``), forwarding each call with the agent's own principal,
issued by ``Federation.connect()`` inside the service.

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

REFUSED = "__refused__"


class FederationService:
    """Owns one :class:`Federation` and its durable ledger; run as a Ray actor (:func:`start_federation_service`)."""

    def __init__(self, config, data, ledger_path: str, *, accountant_name: str = "federation", seed: int = 0):
        from fedmem.dp import Accountant, DurableStore
        from fedmem.federation.engine import Federation

        self.ledger_path = str(ledger_path)
        self.store = DurableStore(self.ledger_path)
        self.fed = Federation(config, data, accountant=Accountant("rdp", store=self.store, name=accountant_name),
                              rng=np.random.default_rng(seed))
        self.accountant_name = accountant_name
        self.busy_s = 0.0
        self.calls = 0

    # ---- what any principal may call
    def connect(self) -> str:
        """A fresh principal id (``Federation.connect()``)."""
        return self.fed.connect().principal

    def retrieve(self, principal: str, q, family: str | None = None, retry_of: int | None = None):
        """The ``Response``, or ``(REFUSED, query_id)`` for the uniform refusal (re-raised by the client)."""
        import time

        from fedmem.errors import SupportPrivacyViolation

        t = time.perf_counter()
        self.calls += 1
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

    def principal_spent(self, principal: str) -> float:
        return float(self.fed.gateway.principal_spent(principal))

    def info(self) -> dict:
        """Public facts an agent needs to read its own principal's bookings from the ledger file."""
        plan = self.fed.plans["primary"]
        return {"ledger_path": self.ledger_path, "accountant": self.fed.gateway.accountant.name,
                "delta": self.fed.config.delta,
                "channels": [(c.name, c.kind) for c in getattr(plan, "channels", ())],
                "exact_channels": list(getattr(plan, "exact_channels", ())),
                "bookable": bool(getattr(plan, "bookable", True))}

    # ---- operator / evaluation only (never given to agents)
    def audit(self) -> list:
        return list(self.fed.audit)

    def ground_truth_many(self, qs) -> list:
        return self.fed.ground_truth_many(np.asarray(qs, dtype=np.float64))

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        self.fed.close()
        self.store.close()


class RemoteMemoryClient:
    """An agent's handle on a :class:`FederationService` with its own principal (the ``MemoryClient`` API)."""

    def __init__(self, service, principal: str, *, timeout_s: float = 120.0):
        if not isinstance(principal, str) or not principal:
            raise ValueError(f"principal must be a non-empty string issued by the service. Found {principal!r}.")
        self._service = service
        self.principal = principal
        self.family = None
        self.timeout_s = float(timeout_s)
        self.responses: list = []
        self.refusals: list = []

    def retrieve(self, q, *, family: str | None = None, retry_of: int | None = None):
        import ray

        from fedmem.federation.gateway import refusal

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
        from fedmem.agent.dpmind import load_minilm
        from fedmem.agent.dpmind.perturb import make_projector

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
