"""The worlds of an agents session: per user, a PairedMem memory pair, a team bank for BRACE,
tasks, and the benchmark content the agents are given (moved up from ``fedmem.agent.session``:
the agent layer receives benchmark content, it never imports it).

:func:`make_world` draws everything a session needs from one injected RNG: one PairedMem
store (side ``M``, carrying its target attribute) and public policy per user, a small team
bank per user for BRACE, and ``tasks`` tasks per user (a federation query from the
federation's shards, a BRACE cue near a bank pattern, the user's next PairedMem query for
the app, and a private NIAH-style long context with its question). Each
:class:`~fedmem.agent.session.UserWorld` carries the benchmark's lexicon (DP-MemView
scorer) and response templates (third-party app), which the agents are built with.
"""

from __future__ import annotations

import numpy as np

from fedmem import _validate as V
from fedmem.agent.client import Task
from fedmem.agent.session import UserWorld
from fedmem.bench.niah import make_sample
from fedmem.bench.shards import sample_queries
from fedmem.experiments import pairedmem as pm


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
    """``n_agents`` users' worlds, each with ``n_tasks`` tasks, drawn from ``rng`` (the pairs,
    the order, the federation queries from ``data``, then per user its bank and per task a
    NIAH context and a BRACE cue); every world carries the benchmark's lexicon and templates."""
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

    lexicon, book = pm.LEXICON, pm.template_book()
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
        worlds.append(UserWorld(f"u{u}", pair, bank, tasks, lexicon, book))
    return worlds
