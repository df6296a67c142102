"""What ``fedmem demo`` (``make demo``) runs and the comparison table it prints at the end."""

from __future__ import annotations

# The demo: what `make demo` runs. Each entry is (title, scenario file, overrides).
# The demo runs the whole adversary library with fewer trials than the shipped scenarios (4 targets x 60
# trials per world instead of 8 x 100) so that it finishes in a few minutes; `fedmem run FILE` runs them in full.
DEMO_SIZE = ["attack.targets=4", "attack.repeats=60", "attack.timing_trials=20"]
DEMO_RUNS = [
    ("Undefended: exact receipts leave with every DP answer (papers/003)", "support_leak_40.toml", DEMO_SIZE),
    ("Gateway: the same receipts behind the support-leak gateway", "support_leak_40_gateway.toml", DEMO_SIZE),
    ("Gateway + broadcast: answered by the support-safe broadcast instead", "support_leak_40_gateway.toml",
     DEMO_SIZE + ['federation.on_reject="rerun_broadcast"', 'name="support_leak_40_gateway_rerun"']),
]


def demo_rows(runs) -> list[tuple[str, list[str]]]:
    """Comparison rows (label, one cell per run) from the runs' metrics."""
    def get(m, *path, default=None):
        for p in path:
            if not isinstance(m, dict) or p not in m:
                return default
            m = m[p]
        return m

    def num(x, fmt="{:.3g}"):
        if x is None:
            return "-"
        if isinstance(x, str):
            return x
        if isinstance(x, float) and x != x:
            return "n/a"
        return fmt.format(x)

    rows = []
    rows.append(("queries answered / refused",
                 [f"{get(m, 'forwarded', default='-')} / {get(m, 'rejected', default='-')}" for m in runs]))
    rows.append(("shards guessed within +-2 (papers/003: 94%)",
                 [num(get(m, "reconstruction", "rate"), "{:.0%}") for m in runs]))
    rows.append(("  ... a constant guess gets",
                 [num(get(m, "reconstruction", "chance_rate"), "{:.0%}") for m in runs]))
    rows.append(("membership AUC (0.5 = coin flip)",
                 [num(get(m, "differencing", "auc"), "{:.2f}") for m in runs]))
    rows.append(("  ... eps proven (lower bound, 95%)",
                 [num(get(m, "differencing", "eps_lower"), "{:.2f}") for m in runs]))
    rows.append(("  ... eps booked for what it saw",
                 [num(get(m, "differencing", "eps_booked"), "{:.2f}") for m in runs]))
    rows.append(("  ... verdict (fedmem.attacks.verdict)",
                 [num(get(m, "differencing", "label", default=get(m, "differencing", "verdict"))) for m in runs]))
    rows.append(("support-leaky answers the agent got",
                 [num(get(m, "forwarded_leaky"), "{}") for m in runs]))
    rows.append(("answers with an unbooked channel",
                 [num(get(m, "forwarded_unbooked"), "{}") for m in runs]))
    rows.append(("attacks that leak beyond the booking",
                 [", ".join(k for k, v in get(m, "attacks", default={}).items()
                            if str(v.get("verdict", "")).startswith(("LEAK", "EXCEEDS"))) or "none"
                  for m in runs]))
    rows.append(("  ... of attacks run",
                 [str(len(get(m, "attacks", default={}))) for m in runs]))
    rows.append(("overall verdict", [num(get(m, "verdict")) for m in runs]))
    rows.append(("total eps booked (adaptive stream)",
                 [num(get(m, "epsilon_spent_total"), "{:.3g}") for m in runs]))
    rows.append(("utility: MSE of released mean",
                 [num(get(m, "utility_mse"), "{:.3g}") for m in runs]))
    return rows
