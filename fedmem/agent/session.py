"""A session: many :class:`~fedmem.agent.client.AgentClient` against one federation.

Each user's :class:`UserWorld` (memory pair, team bank, tasks and the injected benchmark
content) is built by the experiment (:func:`fedmem.experiments.agent_worlds.make_world`
draws everything from one injected RNG). :func:`build_agents` builds the agents (one per
user, each with its own principal from ``Federation.connect()``) and :func:`run_session`
runs every task through :meth:`AgentClient.step`; :class:`ActorSession` and
:func:`open_session` run them as Ray actors or isolated processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from fedmem import _validate as V
from fedmem.agent.client import AgentClient, AgentConfig
from fedmem.agent.lifecycle import close_actors, reopen_agent_ledger


@dataclass
class UserWorld:
    """Everything one user's agent is given: its memory pair, team bank and tasks, and the
    benchmark content the experiment injects (the DP-MemView scorer's ``lexicon``, the
    third-party app's ``template_book``)."""

    user: str
    pair: object            # the PairedMem pair (store "M" is this user's memory)
    bank: np.ndarray
    tasks: list
    lexicon: Mapping        # attribute -> evidence phrases (benchmark content)
    template_book: object   # fedmem.agent.llm.TemplateBook of the app's responder (benchmark content)


def build_agents(worlds, federation, store, config: AgentConfig, rng: np.random.Generator, *, agent_cls=AgentClient,
                 perturber=None, codec=None) -> list[AgentClient]:
    """One agent per user, each with a fresh principal from ``federation.connect()``."""
    agents = []
    for w in worlds:
        client = federation.connect()
        agents.append(agent_cls(w.user, policy=w.pair.policy, memory=w.pair.stores["M"], federation=client,
                                bank=w.bank, config=config, store=store, rng=np.random.default_rng(rng.integers(2**63)),
                                federation_store=federation.gateway.store,
                                federation_accountant=federation.gateway.accountant.name,
                                federation_delta=federation.config.delta, perturber=perturber, codec=codec,
                                lexicon=w.lexicon, template_book=w.template_book))
    return agents


def run_session(agents, worlds) -> list[list]:
    """Every user's tasks in order (round-robin over users, one task each per round)."""
    out = [[] for _ in agents]
    n = max(len(w.tasks) for w in worlds)
    for t in range(n):
        for i, (a, w) in enumerate(zip(agents, worlds)):
            if t < len(w.tasks):
                out[i].append(a.step(w.tasks[t]))
    return out


# --------------------------------------------------------------------------- actors
class ActorSession:
    """One Ray actor per user (:class:`~fedmem.agent.actors.AgentHost`) against one federation service
    (the **in-cluster** mode: boundaries simulated, Ray confines nothing; see
    :class:`fedmem.agent.isolated.IsolatedSession` for the OS-enforced mode).

    Agents get a :class:`~fedmem.agent.federation_service.FederationGate` (``self.gate``),
    never the service handle ``self.fed`` (the operator's: audit, ground truth).

    Files under ``out_dir``: ``federation.sqlite`` (the federation's per-principal
    accountants) and ``ledgers/<user>.sqlite`` (each agent's own ledger). Ray must be
    initialised (``fedmem._ray.ensure_ray``); :meth:`close` kills only the actors this
    session started (``projector`` handles passed in are shared and left running; else it
    starts ``projectors`` services, agents assigned round-robin, one thread each).
    ``agent_cls``: one ``AgentClient`` subclass for all agents, or ``{user: cls}``.
    Use as a context manager.
    """

    def __init__(self, worlds, fed_config, data, config: AgentConfig, out_dir, *, seed: int,
                 agent_cpus: float | None = None, agent_cls=None, step_delay_s: float = 0.0, projector=None,
                 start_batch: int = 8, projectors: int = 2):
        import time
        from pathlib import Path

        import ray

        from fedmem.agent.actors import DEFAULT_AGENT_CPUS, agent_actor_class, start_observer  # lazy: ~7 ms, no heavy package
        from fedmem.agent.dpmind import load_minilm  # lazy: ~220 ms, no heavy package
        from fedmem.agent.federation_service import (start_federation_gate, start_federation_service,  # lazy: ~9 ms, no heavy package
                                                     start_projector_service)

        if not ray.is_initialized():
            raise RuntimeError("ActorSession needs Ray: call fedmem._ray.ensure_ray() first.")
        cpus = DEFAULT_AGENT_CPUS if agent_cpus is None else V.positive("agent_cpus", agent_cpus)
        start_batch = V.positive_int("start_batch", start_batch)
        projectors = V.positive_int("projectors", projectors)
        self.worlds = list(worlds)
        self.out_dir = Path(out_dir)
        (self.out_dir / "ledgers").mkdir(parents=True, exist_ok=True)
        self.fed_path = self.out_dir / "federation.sqlite"
        ss = np.random.SeedSequence(int(seed))
        s_fed, s_agents = ss.spawn(2)
        self._handles = []
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            self.fed = start_federation_service(fed_config, data, self.fed_path,
                                                seed=int(s_fed.generate_state(1)[0]))
            self._handles.append(self.fed)
            self.fed_info = ray.get(self.fed.info.remote())          # operator's (with the ledger path)
            self.gate = start_federation_gate(self.fed)              # what agents get instead of self.fed
            self._handles.append(self.gate)
            agent_info = ray.get(self.gate.info.remote())
            if projector is None:          # the shared nearest-token search (noisy embeddings only)
                projector = [start_projector_service() for _ in range(projectors)]
                self._handles += projector
            self.projectors = list(projector) if isinstance(projector, (list, tuple)) else [projector]
            self.projector = self.projectors[0]
            self.app = start_observer("app", template_book=self.worlds[0].template_book if self.worlds else None)
            self.external = start_observer("external")
            self._handles += [self.app, self.external]
            table, _ = load_minilm()
            table_ref = ray.put(table)
            cls = agent_actor_class(cpus)
            seeds = s_agents.generate_state(len(self.worlds), dtype=np.uint64)
            self.ledger_paths = {w.user: self.out_dir / "ledgers" / f"{w.user}.sqlite" for w in self.worlds}
            self.timings["services_s"] = time.perf_counter() - t0
            self.actors = {}
            self.principals = {}
            for i, (w, s) in enumerate(zip(self.worlds, seeds)):
                if i and i % start_batch == 0:     # start actors a batch at a time: no stampede of imports
                    self._collect_principals()
                self.actors[w.user] = cls.remote(w, config, str(self.ledger_paths[w.user]), self.gate, agent_info,
                                                 table_ref, self.projectors[i % len(self.projectors)], int(s),
                                                 app=self.app,
                                                 external=self.external,
                                                 agent_cls=agent_cls.get(w.user) if isinstance(agent_cls, dict)
                                                 else agent_cls,
                                                 step_delay_s=step_delay_s)
                self._handles.append(self.actors[w.user])
            self._collect_principals()
            self.timings["actors_s"] = time.perf_counter() - t0 - self.timings["services_s"]
        except BaseException:
            self.close()
            raise
        self.config = config
        self.dead: dict[str, dict] = {}
        self.failed: dict[str, list] = {}
        self._pending: dict = {}

    def _collect_principals(self) -> None:
        import ray

        todo = [u for u in self.actors if u not in self.principals]
        self.principals.update(zip(todo, ray.get([self.actors[u].ping.remote() for u in todo])))

    def submit(self):
        """Queue every task of every agent (an actor runs its calls in order; agents run concurrently)."""
        n = max(len(w.tasks) for w in self.worlds)
        for t in range(n):
            for w in self.worlds:
                if t < len(w.tasks) and w.user not in self.dead:
                    self._pending[self.actors[w.user].step.remote(w.tasks[t].index)] = (w.user, w.tasks[t].index)
        return list(self._pending)

    def gather(self) -> dict:
        """Results per user in task order; an agent whose actor died is recorded in ``dead`` with the
        task it was running, and the others go on."""
        import ray

        out: dict[str, list] = {w.user: [] for w in self.worlds}
        step_s: list[float] = []
        refs = list(self._pending)
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            user, t = self._pending.pop(ready[0])
            try:
                res, dt = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as exc:  # noqa: PERF203
                d = self.dead.setdefault(user, {"task": t, "error": type(exc).__name__, "lost_tasks": []})
                d["task"] = min(d["task"], t)
                d["lost_tasks"].append(t)
                continue
            except ray.exceptions.RayTaskError as exc:   # the task raised inside a live agent: recorded, go on
                self.failed.setdefault(user, []).append({"task": t, "error": str(exc).splitlines()[-1][:300]})
                continue
            out[user].append(res)
            step_s.append(dt)
        for u in out:
            out[u].sort(key=lambda r: r.task)
        self.step_s = step_s
        return out

    def run(self) -> dict:
        self.submit()
        return self.gather()

    def service_stats(self) -> dict:
        """Busy time of the shared services (where the serial time goes)."""
        import ray

        return {"federation": ray.get(self.fed.stats.remote()),
                "projectors": ray.get([p.stats.remote() for p in self.projectors])}

    def alive(self) -> list[str]:
        return [w.user for w in self.worlds if w.user not in self.dead]

    def call(self, method: str, *args) -> dict:
        """``method`` on every live agent, as {user: result}."""
        import ray

        users = self.alive()
        vals = ray.get([getattr(self.actors[u], method).remote(*args) for u in users])
        return dict(zip(users, vals))

    def reopen_ledger(self, user: str):
        """A fresh :class:`AgentLedger` on the agent's files (what survives the actor or the driver)."""
        return reopen_agent_ledger(self, user)

    def close(self) -> None:
        if getattr(self, "_handles", None):
            close_actors(getattr(self, "fed", None), self._handles)
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


MODES = ("isolated", "cluster")


def open_session(mode: str, worlds, fed_config, data, config: AgentConfig, out_dir, *, seed: int, **kw):
    """A session of ``mode``: ``"isolated"`` (:class:`fedmem.agent.isolated.IsolatedSession`:
    each agent an OS process outside Ray, its own uid and network namespace where the OS
    allows; the default of ``agents.session``) or ``"cluster"`` (:class:`ActorSession`:
    agents as Ray actors, boundaries simulated). Keyword arguments the mode does not use
    (``agent_cpus`` in isolated mode) are ignored."""
    if mode == "isolated":
        from fedmem.agent.isolated import IsolatedSession  # lazy: ~96 ms, no heavy package

        kw.pop("agent_cpus", None)
        return IsolatedSession(worlds, fed_config, data, config, out_dir, seed=seed, **kw)
    if mode == "cluster":
        for k in ("uid_base", "gid", "netns"):
            kw.pop(k, None)
        return ActorSession(worlds, fed_config, data, config, out_dir, seed=seed, **kw)
    raise ValueError(f"mode must be one of {MODES}. Found {mode!r}.")
