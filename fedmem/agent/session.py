"""A session: many :class:`~fedmem.agent.client.AgentClient` against one federation.

:func:`make_world` draws everything a session needs from one injected RNG: the
federation's shards, one PairedMem store (side ``M``, carrying its target attribute) and
public policy per user, a small team bank per user for BRACE, and ``tasks`` tasks per
user (a federation query, a BRACE cue near a bank pattern, the user's next PairedMem
query for the app, and a private NIAH-style long context with its question).
:func:`run_session` builds the agents (one per user, each with its own principal from
``Federation.connect()``) and runs every task through :meth:`AgentClient.step`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V
from fedmem.agent.client import AgentClient, AgentConfig, Task


@dataclass
class UserWorld:
    user: str
    pair: object            # the PairedMem pair (store "M" is this user's memory)
    bank: np.ndarray
    tasks: list


def make_bank(n: int, d: int, rng: np.random.Generator, *, modes: int = 3, std: float = 0.15) -> np.ndarray:
    """A small team bank: ``modes`` Gaussian clusters in ``d`` dimensions (unit-scale centres)."""
    V.positive_int("n", n, minimum=2)
    V.positive_int("d", d)
    centres = rng.normal(size=(modes, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    lab = rng.integers(modes, size=n)
    return centres[lab] + std * rng.normal(size=(n, d))


def make_world(n_agents: int, n_tasks: int, data, rng: np.random.Generator, *, codec, context_tokens: int = 512,
               bank_size: int = 64, bank_dim: int = 2) -> list[UserWorld]:
    from fedmem.bench import pairedmem as pm
    from fedmem.bench.niah import make_sample
    from fedmem.bench.shards import sample_queries

    V.positive_int("n_agents", n_agents)
    V.positive_int("n_tasks", n_tasks)
    V.positive_int("context_tokens", context_tokens, minimum=64)
    V.rng_check("rng", rng)
    n_pairs = max(16, 4 * -(-n_agents // 4))
    pairs = pm.generate(n_pairs, rng, turns=max(n_tasks, 1))
    order = rng.permutation(len(pairs))[:n_agents]
    queries = sample_queries(data, n_agents * n_tasks, rng)

    def count(text: str) -> int:
        return len(codec.encode(text))

    worlds = []
    for u in range(n_agents):
        pair = pairs[int(order[u])]
        bank = make_bank(bank_size, bank_dim, rng)
        tasks = []
        for t in range(n_tasks):
            sample = make_sample(context_tokens, haystack="essay", needle="numeric", task="single", rng=rng,
                                 count_tokens=count)
            q = sample.questions[0]
            cue = bank[int(rng.integers(bank_size))] + 0.1 * rng.normal(size=bank_dim)
            tasks.append(Task(index=t, fed_query=queries[u * n_tasks + t], cue=cue,
                              app_query=pair.turns[t % len(pair.turns)].query, context=sample.text,
                              question=q.question, answers=q.answers))
        worlds.append(UserWorld(f"u{u}", pair, bank, tasks))
    return worlds


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
                                federation_delta=federation.config.delta, perturber=perturber, codec=codec))
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
