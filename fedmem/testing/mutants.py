"""Privacy mutants of the real code: one seeded defect each, as ``(file, old snippet, new snippet)``.

:func:`apply` writes one mutant into a copy of the tree; a snippet that no longer occurs exactly
once raises :class:`MutantError` (reported loudly by ``scripts/mutation_score.py``, never counted
as caught). The hunter is never told which mutant it faces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class MutantError(RuntimeError):
    """A mutant whose snippet does not apply to this tree."""


@dataclass(frozen=True)
class Mutant:
    name: str
    scenario: str          # the scenario whose fixed hunt should see it (every hunt runs every target anyway)
    file: str
    old: str
    new: str


AGG = "fedmem/federation/aggregator.py"
ENG = "fedmem/federation/engine.py"
GW = "fedmem/federation/gateway.py"
CMP = "fedmem/federation/compute.py"
LED = "fedmem/agent/ledger.py"
FED = "scenarios/support_leak_40_noised.toml"

MUTANTS: tuple[Mutant, ...] = (
    Mutant("aggregator: sum sensitivity off by two (C instead of 2C)", FED, AGG,
           "        return 2.0 * self.clip\n", "        return 1.0 * self.clip\n"),
    Mutant("aggregator: noised receipts released without their noise", FED, AGG,
           "            released_count = float(receipts.sum())\n",
           "            receipts = np.asarray(tallies, dtype=np.float64).copy()\n"
           "            released_count = float(receipts.sum())\n"),
    Mutant("aggregator: released count is the exact n", FED, AGG,
           "        return Release(value=value, count=released_count,",
           "        return Release(value=value, count=float(n),"),
    Mutant("aggregator: value noise dropped", FED, AGG,
           "            value = mech.release(total, rng, sampling=p.sampling,\n"
           "                                 **self._cached(\"sum_grid\", lambda: self._grid(mech))) / denom\n",
           "            value = np.asarray(total, dtype=np.float64) / denom\n"),
    Mutant("aggregator: value noise at half the multiplier", FED, AGG,
           "            mech = self._cached(\"sum\", lambda: p._mechanism(p.sigma))\n",
           "            mech = self._cached(\"sum\", lambda: p._mechanism(p.sigma / 2))\n"),
    Mutant("engine: refusal when nothing was selected (admission depends on the count)", FED, ENG,
           "            rel = rels[b]\n            if b in booked:",
           "            rel = rels[b]\n            if rel.realized_n == 0:\n"
           "                results[b] = refusal(d.query_id)\n                continue\n            if b in booked:"),
    Mutant("engine: refusal text carrying the count", FED, ENG,
           "            rel = rels[b]\n            if b in booked:",
           "            rel = rels[b]\n            if rel.realized_n == 0:\n"
           "                from fedmem.errors import SupportPrivacyViolation\n"
           "                results[b] = SupportPrivacyViolation(f\"no memory available for this query (n={rel.realized_n})\")\n"
           "                continue\n            if b in booked:"),
    Mutant("engine: exception attribute carrying n", FED, ENG,
           "            rel = rels[b]\n            if b in booked:",
           "            rel = rels[b]\n            if rel.realized_n == 0:\n"
           "                results[b] = refusal(d.query_id)\n                results[b].n = rel.realized_n\n"
           "                continue\n            if b in booked:"),
    Mutant("engine: sleep proportional to the count", FED, CMP,
           "        self.timings[\"aggregator\"] += time.perf_counter() - t_agg\n",
           "        time.sleep(0.002 * sum(r.realized_n for r in out))\n"
           "        self.timings[\"aggregator\"] += time.perf_counter() - t_agg\n"),
    Mutant("engine: response carries the realized count in epsilon_spent", FED, ENG,
           "                        epsilon_spent=spent, selection=rel.selection,",
           "                        epsilon_spent=spent + rel.realized_n, selection=rel.selection,"),
    Mutant("gateway: retry not charged", FED, GW,
           "        entries = []\n        for acc, _, cap, why in self._caps(decision.principal, plan):",
           "        entries = []\n        if decision.retry_of is not None:\n            return entries\n"
           "        for acc, _, cap, why in self._caps(decision.principal, plan):"),
    Mutant("gateway: nothing booked (booking skipped)", FED, GW,
           "        entries = []\n        for acc, _, cap, why in self._caps(decision.principal, plan):",
           "        entries = []\n        return entries\n        for acc, _, cap, why in self._caps(decision.principal, plan):"),
    Mutant("gateway: support (receipts) events never booked to the principal", FED, GW,
           "            ev = plan.support_event() if why == \"support_budget\" else plan.event()\n",
           "            ev = plan.support_event() if why == \"support_budget\" else plan.dp_events[0]\n"),
    Mutant("ledger: the agent's ledger reads no federation booking", FED, LED,
           "        return [(json.loads(e), lbl) for e, lbl in rows]\n",
           "        return [(json.loads(e), lbl) for e, lbl in rows][:-1]\n"),
    Mutant("ledger: federation epsilon reported at a looser delta", FED, LED,
           "        acc = Accountant(\"rdp\", store=self.federation_store, name=self.federation_name)\n"
           "        return float(acc.spent(self.federation_delta)) if acc.count else 0.0\n",
           "        acc = Accountant(\"rdp\", store=self.federation_store, name=self.federation_name)\n"
           "        return float(acc.spent(min(0.5, self.federation_delta * 1e5))) if acc.count else 0.0\n"),
)


def check(root: Path, m: Mutant) -> None:
    text = (Path(root) / m.file).read_text()
    n = text.count(m.old)
    if n != 1:
        raise MutantError(f"mutant {m.name!r}: its snippet occurs {n} times in {m.file} (must be exactly once)")


def apply(root: Path, m: Mutant) -> None:
    """Write mutant ``m`` into the tree at ``root`` (a temporary copy)."""
    check(root, m)
    p = Path(root) / m.file
    p.write_text(p.read_text().replace(m.old, m.new))
