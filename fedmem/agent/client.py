"""``AgentClient``: one user's agent, where the four private boundaries meet.

An agent owns, for one user:

* the user's **private local memory**: a PairedMem-style store of slot sentences with
  protected attributes (:class:`~fedmem.agent.memview.policy.MemoryStore`);
* a **federation connection** with its own principal (``Federation.connect()``);
* a **DP-MemView** interface through which a third-party app receives views;
* a **BRACE** memory over a small (team) bank for associative recall of a cue;
* **DP-MIND** token perturbation for long contexts sent to an external model.

:meth:`AgentClient.step` runs one task through them in this order (documented in
``docs/agents.md``), and returns what crossed each boundary:

1. **federation**: ``retrieve(task.fed_query)`` under the agent's principal; the gateway
   books the (epsilon, delta) of the release per principal before the response exists;
   a refusal is the uniform ``SupportPrivacyViolation`` (recorded, nothing released).
2. **BRACE**: ``recall(task.cue)``; ``BraceMemory`` books ``ApproxDpEvent(eps, delta)`` in
   the user's ``brace`` accountant before the bank is touched.
3. **DP-MemView**: ``answer(task.app_query)``; the interface books ``eps`` on every
   affected attribute in the user's ``memview`` ledger before the view is sampled; the
   app (template responder) receives only the released views.
4. **DP-MIND**: the per-token metric-DP epsilon is booked (recorded) in the user's
   ``dpmind`` ledger before the context is perturbed; only perturbed chunks reach the
   external model.
5. **local denoising** of the external model's answer through the private alignment
   (nothing leaves).

Every booking lives in one SQLite store per user (or one shared store with per-user
names ``agent/<user>/<boundary>``; the federation's per-principal accountant sits in the
federation's store and is read from the principal). :class:`AgentLedger` reads them all.

:func:`check_bookings` compares, per boundary, what the taps saw leave with what was
booked; the tests run it on a correct agent and on broken ones (clean context to the
external model, a BRACE recall without booking, an under-booked DP-MIND epsilon).

This module holds the agent (``Task``, ``StepResult``, ``Tap``, ``AgentClient``,
``default_perturber``) and re-exports the parts that live beside it:

* :mod:`fedmem.agent.config`: ``AgentConfig`` and the boundary names;
* :mod:`fedmem.agent.ledger`: ``AgentLedger``;
* :mod:`fedmem.agent.booking_check`: ``check_bookings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedmem import _validate as V
from fedmem.agent.booking_check import check_bookings
from fedmem.agent.config import BOUNDARIES, DPMIND_ATTR, NO_CAP, AgentConfig
from fedmem.agent.ledger import AgentLedger
from fedmem.dp import DurableStore, MetricLaplace
from fedmem.errors import BudgetExceeded, SupportPrivacyViolation

__all__ = ["BOUNDARIES", "DPMIND_ATTR", "NO_CAP", "AgentConfig", "AgentLedger", "Task", "StepResult", "Tap",
           "AgentClient", "default_perturber", "check_bookings"]


# --------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Task:
    """One task: public query parts plus the private long context (stays on the client)."""

    index: int
    fed_query: np.ndarray        # key vector sent to the federation
    cue: np.ndarray              # BRACE cue (bank dimension)
    app_query: Any               # fedmem.agent.memview.policy.Query for the third-party app
    context: str = field(repr=False)   # private long context (only perturbed chunks leave)
    question: str = ""
    answers: tuple[str, ...] = ()


@dataclass
class StepResult:
    """What crossed each boundary for one task (``None``: nothing released there)."""

    task: int
    federation: dict | None      # {"query_id", "value", "event", "channels"} or None when refused
    federation_refused: bool
    brace: np.ndarray | None
    memview_views: tuple          # ((slot, view, fallback), ...)
    app_text: str | None
    dpmind_transcript: list       # complete external view of the DP-MIND loop
    dpmind_tokens: int
    answer: str                   # denoised locally
    dp_answer: str                # what the external model answered
    correct: bool | None


# --------------------------------------------------------------------------- taps
class Tap:
    """Records every message that crosses one boundary, then forwards it (evaluation only)."""

    def __init__(self, inner):
        self.inner = inner
        self.messages: list = []

    def respond(self, messages):
        self.messages.append([dict(m) for m in messages])
        return self.inner.respond(messages)


# --------------------------------------------------------------------------- the agent
class AgentClient:
    """One user's agent (a plain object; :class:`fedmem.agent.actors.AgentHost` runs one per Ray actor).

    ``federation`` is a :class:`~fedmem.federation.client.MemoryClient` (from
    ``Federation.connect()``); ``federation_store`` / ``federation_accountant`` name where the
    federation books its principals, so the ledger can read this principal's spend.

    Benchmark content is injected, never imported: ``lexicon`` (attribute -> evidence phrases)
    feeds the DP-MemView scorer, ``template_book`` (a :class:`~fedmem.agent.llm.TemplateBook`)
    the default third-party app responder (used when ``app_responder`` is None). The experiment
    passes them (``fedmem.experiments.agent_worlds`` puts them in each ``UserWorld``).
    """

    def __init__(self, user: str, *, policy, memory, federation, bank, config: AgentConfig,
                 store: DurableStore, rng: np.random.Generator, lexicon, template_book, app_responder=None,
                 external_responder=None, federation_store: DurableStore | None = None,
                 federation_accountant: str = "federation", federation_delta: float = 1e-6, perturber=None, codec=None):
        from fedmem.agent.brace import BraceMemory, BraceParams  # lazy: loads scipy, numpy (~1.1 s)
        from fedmem.agent.memview import MemViewInterface, PaperScorer, PhraseLexicon  # lazy: ~75 ms, no heavy package

        if not isinstance(config, AgentConfig):
            raise TypeError(f"config must be an AgentConfig. Found {type(config).__name__}.")
        V.rng_check("rng", rng)
        for name in ("retrieve", "principal"):
            if not hasattr(federation, name):
                raise TypeError(f"federation must be a MemoryClient from Federation.connect() (needs {name}). "
                                f"Found {type(federation).__name__}.")
        self.user = user
        self.config = config
        self.federation = federation
        self._rng = rng
        # independent generators per boundary, all from the injected one
        seeds = rng.integers(0, 2**63 - 1, size=3)
        reader = getattr(federation, "bookings", None) if federation_store is None else None
        self.ledger = AgentLedger(user, store, config, policy.attributes, federation_store=federation_store,
                                  federation_accountant=federation_accountant, principal=federation.principal,
                                  federation_delta=federation_delta, federation_reader=reader)
        self.memview = MemViewInterface(policy, memory, PaperScorer(PhraseLexicon(lexicon)),
                                        caps=self.ledger.memview_caps, rng=np.random.default_rng(seeds[0]),
                                        mode="online", K=config.memview_K, ledger_store=store,
                                        name=self.ledger.memview_name)
        bank = np.asarray(bank, dtype=np.float64)
        self.brace_params = BraceParams.from_beta(config.brace_beta, T=config.brace_T, epsilon=config.brace_epsilon,
                                                  delta=config.brace_delta, d=bank.shape[1])
        self.brace = BraceMemory(bank, self.brace_params, self.ledger.brace, np.random.default_rng(seeds[1]),
                                 label=f"agent/{user} brace recall")
        self._dpmind_rng = np.random.default_rng(seeds[2])
        if perturber is None or codec is None:
            perturber, codec = default_perturber(config.dpmind_epsilon)
        if perturber.epsilon != config.dpmind_epsilon:
            raise ValueError(f"perturber epsilon must equal config.dpmind_epsilon={config.dpmind_epsilon!r}. "
                             f"Found {perturber.epsilon!r}.")
        self._perturber, self._codec = perturber, codec
        if app_responder is None:
            from fedmem.agent.llm import TemplateResponder  # lazy: ~160 ms, no heavy package

            app_responder = TemplateResponder(template_book)
        if external_responder is None:
            from fedmem.agent.dpmind import ExtractiveMemoryAgent  # lazy: ~310 ms, no heavy package

            external_responder = ExtractiveMemoryAgent()
        self.app = Tap(app_responder)              # third-party app: sees only DP-MemView views
        self.external = Tap(external_responder)    # external model: sees only perturbed chunks
        self.federation_seen: list[dict] = []      # every federation response this agent received
        self.brace_released: list[np.ndarray] = []
        self.memview_released: list = []          # Release objects handed to the app
        self.dpmind_sent: list[dict] = []         # {"context": i, "booking": label, "chunks": (...)}
        self.results: list[StepResult] = []

    def __reduce__(self):  # holds a private store and bank: never pickled out
        raise TypeError("AgentClient holds private memory and cannot be pickled.")

    # ---- boundaries, each a method so a broken variant can override exactly one
    def _federated_recall(self, task: Task):
        try:
            r = self.federation.retrieve(task.fed_query, family=f"agent-{self.user}")
        except SupportPrivacyViolation:
            return None
        out = {"query_id": r.query_id, "value": np.asarray(r.value), "event": r.event, "channels": r.channels}
        self.federation_seen.append(out)
        return out

    def _brace_recall(self, task: Task):
        try:
            y = self.brace.recall(task.cue)         # books before computing
        except BudgetExceeded:
            return None
        self.brace_released.append(y)
        return y

    def _app_view(self, task: Task):
        from fedmem.agent.llm import memview_messages  # lazy: ~160 ms, no heavy package

        rel = self.memview.answer(task.app_query)  # books before sampling
        self.memview_released.append(rel)
        vocabs = self.memview.policy.vocabularies
        views = tuple((s.slot, s.view, vocabs[s.slot].views[vocabs[s.slot].index(s.view)].description)
                      for s in rel.slots)
        text = self.app.respond(memview_messages(task.app_query.text, tuple(s.slot for s in rel.slots), views))
        return rel, text

    def _book_dpmind(self, task: Task) -> str | None:
        label = f"task={task.index} ctx={len(self.dpmind_sent)}"
        if not self.ledger.dpmind.try_charge([DPMIND_ATTR], self.config.dpmind_epsilon, label=label):
            return None
        return label

    def _dpmind(self, task: Task):
        from fedmem.agent.dpmind import DPMindClient  # lazy: ~310 ms, no heavy package

        label = self._book_dpmind(task)            # recorded before anything is perturbed or sent
        if label is None:
            return None
        client = DPMindClient(self._perturber, self._codec, chunk_tokens=self.config.dpmind_chunk_tokens,
                              restore_k=self.config.dpmind_restore_k)
        n = client.ingest(task.context, self._dpmind_rng)
        self.dpmind_sent.append({"context": len(self.dpmind_sent), "task": task.index, "booking": label,
                                 "epsilon": self.config.dpmind_epsilon, "chunks": client.chunks, "tokens": n})
        return client.ask(task.question, self.external), n

    # ---- one task
    def step(self, task: Task) -> StepResult:
        """federation -> BRACE -> DP-MemView view for the app -> DP-MIND -> local denoising."""
        if not isinstance(task, Task):
            raise TypeError(f"task must be a Task. Found {type(task).__name__}.")
        fed = self._federated_recall(task)
        y = self._brace_recall(task)
        rel, app_text = self._app_view(task)
        dm = self._dpmind(task)
        ans, n = (None, 0) if dm is None else dm
        final = "" if ans is None else ans.final_answer
        correct = None
        if task.answers and ans is not None:
            correct = any(a.lower() in final.lower() for a in task.answers)
        res = StepResult(task=task.index, federation=fed, federation_refused=fed is None, brace=y,
                         memview_views=tuple((s.slot, s.view, s.fallback) for s in rel.slots), app_text=app_text,
                         dpmind_transcript=[] if ans is None else ans.transcript, dpmind_tokens=n, answer=final,
                         dp_answer="" if ans is None else ans.dp_answer, correct=correct)
        self.results.append(res)
        return res

    def spend(self) -> dict:
        return self.ledger.summary()


def default_perturber(epsilon: float, projection: str = "cascade"):
    """The MiniLM table, codec and an L2 metric-Laplace perturber (cached projector)."""
    from fedmem.agent.dpmind import TokenPerturber, load_minilm  # lazy: ~310 ms, no heavy package
    from fedmem.agent.dpmind.perturb import cached_projector  # lazy: ~410 ms, no heavy package

    table, codec = load_minilm()
    return TokenPerturber(MetricLaplace(float(epsilon), table.dim), table, cached_projector(table, projection)), codec
