"""One Ray actor per user: :class:`AgentHost` runs an :class:`~fedmem.agent.client.AgentClient`.

Processes and what crosses between them (``docs/agents.md`` has the diagram):

* **agent actor** (one per user, ``num_cpus`` small so 100 fit on 2 cores): the user's
  private memory, team bank, long contexts and its *own* durable ledger file
  (``ledgers/<user>.sqlite``: ``agent/<user>/{brace,memview,dpmind}``), booked before
  each release. The plain ``AgentClient`` never leaves the actor (it refuses pickling).
* **federation service** (:class:`~fedmem.agent.federation_service.FederationService`):
  one ``Federation`` for all agents, reached by agents only through a
  :class:`~fedmem.agent.federation_service.FederationGate` (connect, query under the
  agent's own capability, its own spend and bookings); each agent holds a
  ``RemoteMemoryClient`` on the gate with the capability ``connect()`` issued to it. The
  gateway books into the federation's file (opened only by the service, mode 0600)
  before a response leaves; the agent reads its own bookings through the gate.

This is the **in-cluster** mode (``mode="cluster"``): Ray confines nothing between actors,
so these boundaries are simulated (docs/agents.md). The isolated mode
(:mod:`fedmem.agent.isolated`, the default of ``agents.session``) runs the same
``AgentClient`` in an OS process outside Ray.
* **projector service**: nearest-token search on the *noisy* embeddings only.
* **third-party app** and **external model provider** (:class:`BoundaryObserver`): one
  actor each, shared by all agents; each records every message it receives (that is the
  adversary's view) and answers with the template responder / the extractive memory
  agent.

The driver only dispatches task indices and collects :class:`~fedmem.agent.client.StepResult`.
If an agent actor dies, its ledger file (written before every release) still holds every
charge, and the session goes on with the other agents.
"""

from __future__ import annotations

import numpy as np

DEFAULT_AGENT_CPUS = 0.01


class BoundaryObserver:
    """The party on the other side of one boundary: records every message, then responds.

    ``kind``: ``"app"`` (template responder on DP-MemView views, with the benchmark's
    ``template_book`` injected by the session) or ``"external"`` (``ExtractiveMemoryAgent``,
    the external model of the DP-MIND loop). ``received`` is exactly what crossed the
    boundary, per user, in arrival order.
    """

    def __init__(self, kind: str, template_book=None):
        if kind == "app":
            from fedmem.agent.llm import TemplateResponder  # lazy: ~200 ms, no heavy package

            if template_book is None:
                raise TypeError("the app observer needs the benchmark's template_book (a TemplateBook).")
            self.inner = TemplateResponder(template_book)
        elif kind == "external":
            from fedmem.agent.dpmind import ExtractiveMemoryAgent  # lazy: loads dp_accounting (~630 ms)

            self.inner = ExtractiveMemoryAgent()
        else:
            raise ValueError(f"kind must be 'app' or 'external'. Found {kind!r}.")
        self.kind = kind
        self.received: list[tuple[str, list]] = []

    def respond(self, user: str, messages) -> str:
        self.received.append((user, [dict(m) for m in messages]))
        return self.inner.respond(messages)

    def messages(self, user: str | None = None) -> list:
        return [m for u, m in self.received if user is None or u == user]

    def count(self, user: str | None = None) -> int:
        return sum(1 for u, _ in self.received if user is None or u == user)

    def ping(self) -> bool:
        return True


class ObserverResponder:
    """Agent-side responder that sends the messages to a :class:`BoundaryObserver` actor."""

    def __init__(self, observer, user: str, timeout_s: float = 120.0):
        self._observer, self.user, self.timeout_s = observer, user, float(timeout_s)

    def respond(self, messages) -> str:
        import ray

        return ray.get(self._observer.respond.remote(self.user, [dict(m) for m in messages]), timeout=self.timeout_s)


class AgentHost:
    """Body of the per-user agent actor; builds the ``AgentClient`` inside the actor's process."""

    def __init__(self, world, config, ledger_path: str, fed_gate, fed_info: dict, table, projector_service,
                 seed: int, *, app=None, external=None, agent_cls=None, step_delay_s: float = 0.0):
        import ray

        from fedmem.agent.client import AgentClient  # lazy: loads dp_accounting (~370 ms)
        from fedmem.agent.dpmind import TokenPerturber, WordPieceCodec  # lazy: loads dp_accounting (~630 ms)
        from fedmem.agent.dpmind.embeddings import minilm_dir  # lazy: loads dp_accounting (~590 ms)
        from fedmem.agent.federation_service import RemoteMemoryClient, RemoteProjector  # lazy: ~13 ms, no heavy package
        from fedmem.dp import DurableStore, MetricLaplace  # lazy: loads dp_accounting (~380 ms)

        self.user = world.user
        self.ledger_path = str(ledger_path)
        store = DurableStore(self.ledger_path)
        principal = ray.get(fed_gate.connect.remote())       # this agent's capability
        client = RemoteMemoryClient(fed_gate, principal)
        perturber = TokenPerturber(MetricLaplace(float(config.dpmind_epsilon), table.dim), table,
                                   RemoteProjector(projector_service, table))
        codec = WordPieceCodec(minilm_dir() / "tokenizer.json")
        cls = agent_cls or AgentClient
        self.agent = cls(world.user, policy=world.pair.policy, memory=world.pair.stores["M"], federation=client,
                         bank=world.bank, config=config, store=store, rng=np.random.default_rng(int(seed)),
                         federation_store=None, federation_accountant=fed_info["accountant"],
                         federation_delta=fed_info["delta"], perturber=perturber, codec=codec,
                         lexicon=world.lexicon, template_book=world.template_book,
                         app_responder=None if app is None else ObserverResponder(app, world.user),
                         external_responder=None if external is None else ObserverResponder(external, world.user))
        self.tasks = {t.index: t for t in world.tasks}
        self.step_delay_s = float(step_delay_s)

    def ping(self) -> str:
        """The agent's public principal label (never its capability)."""
        return str(self.agent.federation.principal)

    def pid(self) -> int:
        import os

        return os.getpid()

    def step(self, t: int):
        import time

        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        t0 = time.perf_counter()
        res = self.agent.step(self.tasks[int(t)])
        return res, time.perf_counter() - t0

    def spend(self) -> dict:
        return self.agent.spend()

    def composed(self, delta: float) -> dict:
        return self.agent.ledger.composed(delta)

    def check(self, seed: int, dpmind_stat_contexts: int | None = None) -> dict:
        from fedmem.agent.client import check_bookings  # lazy: loads dp_accounting (~370 ms)

        sent = {s["task"] for s in self.agent.dpmind_sent}
        return check_bookings(self.agent, [t for i, t in self.tasks.items() if i in sent],
                              rng=np.random.default_rng(int(seed)), dpmind_stat_contexts=dpmind_stat_contexts)

    def exposures(self) -> dict:
        """What crossed each boundary, as the agent's taps recorded it (evaluation only)."""
        a = self.agent
        return {
            "principal": str(a.federation.principal),
            "federation": [{"query_id": r["query_id"], "value": r["value"]} for r in a.federation_seen],
            "memview": [(rel.turn, tuple((s.slot, s.view, s.fallback) for s in rel.slots))
                        for rel in a.memview_released],
            "dpmind": [{"task": s["task"], "chunks": tuple(s["chunks"]), "booking": s["booking"]}
                       for s in a.dpmind_sent],
            "brace": len(a.brace_released),
        }


def agent_actor_class(num_cpus: float = DEFAULT_AGENT_CPUS):
    """``AgentHost`` as a Ray actor class (no restarts: a dead agent stays dead and is reported)."""
    import ray

    return ray.remote(num_cpus=num_cpus, max_restarts=0, max_task_retries=0)(AgentHost)


def start_observer(kind: str, *, num_cpus: float = 0.05, template_book=None):
    """A :class:`BoundaryObserver` actor (``template_book``: the app's templates, for ``kind="app"``)."""
    import ray

    h = ray.remote(num_cpus=num_cpus, max_restarts=0)(BoundaryObserver).remote(kind, template_book)
    ray.get(h.ping.remote())
    return h
