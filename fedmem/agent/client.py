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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant, AttributeLedger, DurableStore, PureDpEvent
from fedmem.errors import BudgetExceeded, SupportPrivacyViolation

BOUNDARIES = ("federation", "memview", "brace", "dpmind")
DPMIND_ATTR = "per_token"
NO_CAP = 1e300


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class AgentConfig:
    """Public parameters of one agent (validated at construction; ``ValueError`` names the field)."""

    memview_cap: float = 2.0          # B_a per protected attribute (pure epsilon)
    memview_K: int = 3                # online mode: eps = B_a / K per charged selection
    brace_beta: float = 0.5           # r = sqrt(2 / beta)
    brace_T: int = 3
    brace_epsilon: float = 2.0
    brace_delta: float = 1e-6
    brace_budget_epsilon: float = 20.0   # user's BRACE budget (epsilon at brace_budget_delta)
    brace_budget_delta: float = 1e-5
    dpmind_epsilon: float = 100.0     # metric-DP epsilon per token (L2 on MiniLM rows)
    dpmind_chunk_tokens: int = 256
    dpmind_restore_k: int = 32
    dpmind_token_cap: float = math.inf   # cap on the summed per-token epsilon over contexts (inf: record only)

    def __post_init__(self):
        for name in ("memview_cap", "brace_beta", "brace_epsilon", "brace_budget_epsilon", "dpmind_epsilon"):
            V.positive(name, getattr(self, name))
        for name in ("memview_K", "brace_T", "dpmind_chunk_tokens", "dpmind_restore_k"):
            V.positive_int(name, getattr(self, name))
        for name in ("brace_delta", "brace_budget_delta"):
            V.open_unit(name, getattr(self, name))
        cap = self.dpmind_token_cap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap <= 0:
            raise ValueError(f"dpmind_token_cap must be positive (math.inf records only). Found {cap!r}.")


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


# --------------------------------------------------------------------------- ledger
class AgentLedger:
    """One user's end-to-end ledger: names ``agent/<user>/{brace,memview,dpmind}`` in ``store``,
    plus the federation principal's accountant (``<fed>/principal/<label>``): read from
    ``federation_store`` (the operator, or an in-process session), or, for an agent that may
    not open the federation's file, from ``federation_reader``: a callable
    returning the (event dict, label) bookings of the agent's own capability (the gate's or
    the isolated RPC's ``bookings``). ``principal`` is kept as its public label only.
    """

    def __init__(self, user: str, store: DurableStore, config: AgentConfig, attributes: Sequence[str], *,
                 federation_store: DurableStore | None = None, federation_accountant: str = "federation",
                 principal: str | None = None, federation_delta: float = 1e-6, federation_reader=None):
        if not isinstance(user, str) or not user or "/" in user:
            raise ValueError(f"user must be a non-empty string without '/'. Found {user!r}.")
        if not isinstance(store, DurableStore):
            raise TypeError(f"store must be a DurableStore. Found {type(store).__name__}.")
        self.user = user
        self.store = store
        self.config = config
        prefix = f"agent/{user}"
        self.brace = Accountant("rdp", store=store, name=f"{prefix}/brace",
                                budget=(config.brace_budget_epsilon, config.brace_budget_delta))
        self.memview_name = f"{prefix}/memview"
        self.memview_caps = {a: config.memview_cap for a in attributes}
        cap = NO_CAP if math.isinf(config.dpmind_token_cap) else config.dpmind_token_cap
        self.dpmind = AttributeLedger({DPMIND_ATTR: cap}, store=store, name=f"{prefix}/dpmind")
        self.federation_store = federation_store
        self.federation_reader = federation_reader
        principal = None if principal is None else str(principal)      # the label, never the capability
        self.federation_name = None if principal is None else f"{federation_accountant}/principal/{principal}"
        self.principal = principal
        self.federation_delta = V.open_unit("federation_delta", federation_delta)

    # ---- reading (durable: a fresh AgentLedger on the same file sees the same numbers)
    def memview_ledger(self) -> AttributeLedger:
        return AttributeLedger(self.memview_caps, store=self.store, name=self.memview_name)

    def federation_bookings(self) -> list[tuple[dict, str]]:
        """(event, label) of every release the federation booked to this user's principal."""
        if self.federation_store is None and self.federation_reader is not None:
            return [(dict(e), str(lbl)) for e, lbl in self.federation_reader()]
        if self.federation_store is None or self.federation_name is None:
            return []
        rows = self.federation_store.read(
            "SELECT event, label FROM accountant_events WHERE accountant=? ORDER BY id", (self.federation_name,))
        return [(json.loads(e), lbl) for e, lbl in rows]

    def federation_epsilon(self) -> float:
        if self.federation_store is None and self.federation_reader is not None:
            from fedmem.dp.accountant import event_from_dict

            acc = Accountant("rdp")
            for ev, lbl in self.federation_bookings():
                acc.book(event_from_dict(ev), label=lbl)
            return float(acc.spent(self.federation_delta)) if acc.count else 0.0
        if self.federation_store is None or self.federation_name is None:
            return 0.0
        acc = Accountant("rdp", store=self.federation_store, name=self.federation_name)
        return float(acc.spent(self.federation_delta)) if acc.count else 0.0

    def summary(self) -> dict:
        mv = self.memview_ledger().spent()
        brace_eps = float(self.brace.spent(self.config.brace_budget_delta)) if self.brace.count else 0.0
        dpm = self.dpmind.history()
        return {
            "user": self.user,
            "principal": self.principal,
            "federation": {"epsilon": self.federation_epsilon(), "delta": self.federation_delta,
                           "releases": len(self.federation_bookings())},
            "memview": {"per_attribute": mv, "max_epsilon": max(mv.values()) if mv else 0.0,
                        "charges": len(self.memview_ledger().history())},
            "brace": {"epsilon": brace_eps, "delta": self.config.brace_budget_delta, "releases": self.brace.count},
            "dpmind": {"epsilon_per_token": self.config.dpmind_epsilon, "contexts": len(dpm),
                       "summed_per_token": float(sum(c.epsilon for c in dpm))},
        }

    def composed(self, delta: float) -> dict:
        """(epsilon, delta) of federation + BRACE + the largest DP-MemView attribute spend,
        composed by dp-accounting (RDP) as if one individual's data reached all three
        (an upper bound; DP-MIND's metric DP is reported apart, never composed)."""
        from fedmem.dp.accountant import event_from_dict

        acc = Accountant("rdp")
        parts = {}
        for ev, lbl in self.federation_bookings():
            acc.book(event_from_dict(ev), label=lbl)
        parts["federation"] = float(acc.spent(delta)) if acc.count else 0.0
        n = acc.count
        for b in self.brace.history:
            acc.book(event_from_dict(b.event), label=b.label)
        mv = self.memview_ledger().spent()
        top = max(mv.values()) if mv else 0.0
        if top > 0:
            acc.book(PureDpEvent(top), label="memview max attribute")
        total = float(acc.spent(delta)) if acc.count else 0.0
        return {"epsilon": total, "delta": delta, "federation_only": parts["federation"], "events": acc.count,
                "federation_events": n}


# --------------------------------------------------------------------------- the agent
class AgentClient:
    """One user's agent (a plain object; :class:`fedmem.agent.actors.AgentHost` runs one per Ray actor).

    ``federation`` is a :class:`~fedmem.federation.client.MemoryClient` (from
    ``Federation.connect()``); ``federation_store`` / ``federation_accountant`` name where the
    federation books its principals, so the ledger can read this principal's spend.
    """

    def __init__(self, user: str, *, policy, memory, federation, bank, config: AgentConfig,
                 store: DurableStore, rng: np.random.Generator, app_responder=None, external_responder=None,
                 federation_store: DurableStore | None = None, federation_accountant: str = "federation",
                 federation_delta: float = 1e-6, perturber=None, codec=None):
        from fedmem.agent.brace import BraceMemory, BraceParams
        from fedmem.agent.memview import MemViewInterface, PaperScorer, PhraseLexicon
        from fedmem.bench import pairedmem as pm

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
        self.memview = MemViewInterface(policy, memory, PaperScorer(PhraseLexicon(pm.LEXICON)),
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
            from fedmem.agent.llm import TemplateResponder

            app_responder = TemplateResponder(pm.template_book())
        if external_responder is None:
            from fedmem.agent.dpmind import ExtractiveMemoryAgent

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
        from fedmem.agent.llm import memview_messages

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
        from fedmem.agent.dpmind import DPMindClient

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
    from fedmem.agent.dpmind import TokenPerturber, load_minilm
    from fedmem.agent.dpmind.perturb import cached_projector
    from fedmem.dp import MetricLaplace

    table, codec = load_minilm()
    return TokenPerturber(MetricLaplace(float(epsilon), table.dim), table, cached_projector(table, projection)), codec


# --------------------------------------------------------------------------- the check
def check_bookings(agent: AgentClient, tasks: Sequence[Task], *, rng: np.random.Generator,
                   dpmind_alpha: float = 1e-6, dpmind_stat_contexts: int | None = None) -> dict[str, list[str]]:
    """Per boundary, problems found comparing what left (taps) with what was booked.

    * federation: every response the agent received has a booking in the principal's
      accountant with its query id and exactly its event; no response without one.
    * memview: the ledger's per-attribute spend equals what the released, non-fallback
      views cost under the public policy (eps = B_a/K on every attribute whose group
      meets the read set); every message the app got carries only released views.
    * brace: one ``ApproxDpEvent(eps, delta)`` booking per released recall.
    * dpmind: one booking per context sent, with the perturber's epsilon; every chunk in
      the external transcript is one of the booked contexts' chunks; and the sent chunks
      are statistically consistent with the booked epsilon: the fraction of tokens left
      unchanged must not exceed a one-sided binomial upper bound (level ``dpmind_alpha``)
      of the fraction the booked mechanism leaves unchanged on the same clean text
      (re-sampled here with ``rng``). A clean context (fraction 1) or noise for a larger
      epsilon than booked fails this. ``dpmind_stat_contexts``: run the statistical part on
      that many contexts drawn with ``rng`` (None: all); the counting checks always cover all.
    """
    from fractions import Fraction

    from scipy import stats

    problems: dict[str, list[str]] = {b: [] for b in BOUNDARIES}
    led = agent.ledger
    # ---- federation
    booked = led.federation_bookings()
    by_q = {}
    for ev, lbl in booked:
        qid = lbl.split(" ", 1)[0]
        by_q[qid] = ev
    for r in agent.federation_seen:
        ev = by_q.get(f"q{r['query_id']}")
        if ev is None:
            problems["federation"].append(f"response q{r['query_id']} left without a booking")
        elif r["event"] is not None and json.dumps(ev, sort_keys=True) != json.dumps(r["event"], sort_keys=True):
            problems["federation"].append(f"response q{r['query_id']} booked {ev} but released {r['event']}")
    if len(booked) != len(agent.federation_seen):
        problems["federation"].append(f"{len(booked)} bookings for {len(agent.federation_seen)} responses")
    # ---- memview
    pol = agent.memview.policy
    expected = {a: Fraction(0) for a in pol.attributes}
    released_views = set()
    for rel in agent.memview_released:
        for s in rel.slots:
            released_views.add((rel.turn, s.slot, s.view))
            gamma = pol.charge_set(pol.read_set(rel.query, s.slot))
            if gamma and not s.fallback:
                eps = Fraction(agent.memview.epsilon_for(gamma))
                for a in gamma:
                    expected[a] += eps
    spent = led.memview_ledger().spent()
    for a in pol.attributes:
        if abs(spent[a] - float(expected[a])) > 1e-12:
            problems["memview"].append(f"attribute {a}: booked {spent[a]} but released views cost {float(expected[a])}")
    n_views = sum(len(r.slots) for r in agent.memview_released)
    app_view_lines = sum(1 for msgs in agent.app.messages for line in msgs[-1]["content"].splitlines()
                         if line.startswith("View["))
    if app_view_lines > n_views:
        problems["memview"].append(f"the app received {app_view_lines} view lines for {n_views} released views")
    if len(agent.app.messages) != len(agent.memview_released):
        problems["memview"].append(f"{len(agent.app.messages)} app messages for {len(agent.memview_released)} "
                                   f"interface releases")
    # ---- brace
    hist = led.brace.history
    want = agent.brace_params.event()
    from fedmem.dp.accountant import event_to_dict

    if len(hist) != len(agent.brace_released):
        problems["brace"].append(f"{len(hist)} bookings for {len(agent.brace_released)} released recalls")
    for b in hist:
        if json.dumps(b.event, sort_keys=True) != json.dumps(event_to_dict(want), sort_keys=True):
            problems["brace"].append(f"booking {b.id} is {b.event}, recall releases {event_to_dict(want)}")
    # ---- dpmind
    charges = led.dpmind.history()
    labels = {c.label: c.epsilon for c in charges}
    sent_chunks: set[str] = set()
    for s in agent.dpmind_sent:
        eps = labels.get(s["booking"])
        if eps is None:
            problems["dpmind"].append(f"context {s['context']} sent without a booking")
        elif eps != agent._perturber.epsilon:
            problems["dpmind"].append(f"context {s['context']} booked eps={eps}, perturbed at {agent._perturber.epsilon}")
        sent_chunks.update(s["chunks"])
    if len(charges) != len(agent.dpmind_sent):
        problems["dpmind"].append(f"{len(charges)} bookings for {len(agent.dpmind_sent)} contexts sent")
    n_chunks = sum(len(s["chunks"]) for s in agent.dpmind_sent)
    carrying = sum(1 for msgs in agent.external.messages if any(c in msgs[-1]["content"] for c in sent_chunks))
    if carrying < n_chunks:
        problems["dpmind"].append(f"{carrying} external prompts carry a booked chunk, {n_chunks} chunks were sent")
    # statistical: what left vs. the booked mechanism on the same clean text (same pipeline)
    from fedmem.agent.dpmind import DPMindClient, TokenPerturber
    from fedmem.dp import MetricLaplace

    by_task = {t.index: t for t in tasks}
    same = same_ref = total = 0
    codec = agent._codec
    stat = list(agent.dpmind_sent)
    if dpmind_stat_contexts is not None:
        V.positive_int("dpmind_stat_contexts", dpmind_stat_contexts)
        if len(stat) > dpmind_stat_contexts:
            pick = sorted(rng.choice(len(stat), size=dpmind_stat_contexts, replace=False).tolist())
            stat = [stat[i] for i in pick]
    for s in stat:
        t = by_task.get(s["task"])
        if t is None:
            problems["dpmind"].append(f"context {s['context']}: task {s['task']} not given to the check")
            continue
        eps = labels.get(s["booking"], agent._perturber.epsilon)
        ref = DPMindClient(TokenPerturber(MetricLaplace(float(eps), agent._perturber.table.dim),
                                          agent._perturber.table, agent._perturber.projector), codec,
                           chunk_tokens=agent.config.dpmind_chunk_tokens)
        ref.ingest(t.context, rng)
        clean = _bag(codec.encode(t.context))
        same += _overlap(clean, _bag(codec.encode(" ".join(s["chunks"]))))
        same_ref += _overlap(clean, _bag(codec.encode(" ".join(ref.chunks))))
        total += sum(clean.values())
    if total:
        p_ref = min(1.0, (same_ref + 1) / (total + 1))
        upper = total if p_ref >= 1 else float(stats.binom.isf(dpmind_alpha, total, p_ref))
        if same > upper:
            problems["dpmind"].append(
                f"{same}/{total} clean tokens survive in what left, above {upper:.0f} (alpha={dpmind_alpha}) "
                f"for the booked epsilon (reference {same_ref}/{total}): less perturbed than booked")
    return problems


def _bag(ids) -> dict:
    from collections import Counter

    return Counter(int(i) for i in ids)


def _overlap(a: dict, b: dict) -> int:
    """Clean tokens that survive in the sent text (multiset intersection: robust to re-tokenisation shifts)."""
    return int(sum(min(c, b.get(k, 0)) for k, c in a.items()))
