"""The fault rounds of ``flower.support_leak`` (:mod:`fedmem.experiments.flower`): the plan
(which rounds fail or drop out, after the attack rounds), one report row per fault kind and
deployment (what Flower's server got and released, the noise its DP wrapper added against
the calibration the realized reply count needs, what the gateway did and booked), the
gateway ledger check (nothing lost) and the prose reading of the fault table."""

from __future__ import annotations

import math

import numpy as np

def fault_plan(cfg, qs, first_round: int, rng):
    """Fault rounds after the attack rounds: ``fail_rounds`` with one ClientApp raising, ``dropout_rounds``
    with ``dropout_clients`` replying after the deadline, alternating (fail first). Returns the extra
    rounds and the spec entries (drops, stalls, stall_s, round_timeouts) plus {round: kind}."""
    fl, f = cfg.faults, cfg.federation
    kinds = []
    for i in range(max(fl.fail_rounds, fl.dropout_rounds)):
        if i < fl.fail_rounds:
            kinds.append("fail")
        if i < fl.dropout_rounds:
            kinds.append("dropout")
    rounds, drops, stalls, timeouts, kind_of = [], {}, {}, {}, {}
    for j, kind in enumerate(kinds):
        rnd = first_round + j
        rounds.append({"query": qs[j % len(qs)].tolist(), "world": 0, "target": -1, "kind": kind})
        kind_of[rnd] = kind
        if kind == "fail":
            drops.setdefault(int(rng.integers(f.shards)), []).append(rnd)
        else:
            for c in rng.choice(f.shards, size=fl.dropout_clients, replace=False):
                stalls.setdefault(int(c), []).append(rnd)
            timeouts[rnd] = fl.deadline_s
    spec = {"drops": drops, "stalls": stalls, "stall_s": fl.deadline_s + fl.stall_s, "round_timeouts": timeouts}
    return rounds, spec, kind_of


def chi2_std_ci(noise, alpha):
    """Pooled std of zero-mean noise samples and its chi-square CI."""
    from scipy.stats import chi2

    x = np.asarray(noise, dtype=np.float64).ravel()
    n = x.size
    s2 = float(np.mean(x ** 2))
    return math.sqrt(s2), (math.sqrt(s2 * n / chi2.ppf(1 - alpha / 2, n)), math.sqrt(s2 * n / chi2.ppf(alpha / 2, n)))


def eps_of(multiplier: float, delta: float) -> float:
    import dp_accounting

    from fedmem.dp import Accountant  # lazy: loads dp_accounting (~110 ms)

    acc = Accountant("rdp")
    acc.book(dp_accounting.GaussianDpEvent(multiplier), "probe")
    return acc.spent(delta)


def fault_rows(label, run_out, kind_of, f, alpha, flower_dp: bool):
    """One row per fault kind for a deployment: what Flower's server got and what left."""
    recs = {r["round"]: r for r in run_out["records"]}
    aggs = run_out.get("aggregates", {})
    gw = run_out.get("gateway")
    audit = {a["server_round"]: a for a in gw["audit"]} if gw else {}
    rows, out = [], {}
    m = f.shards
    for kind in ("fail", "dropout"):
        rnds = [r for r, k in kind_of.items() if k == kind]
        if not rnds:
            continue
        replies = [len(recs.get(r, {}).get("replied", [])) for r in rnds]
        failures = [int(recs.get(r, {}).get("failures", 0)) for r in rnds]
        released = [r for r in rnds if recs.get(r, {}).get("output") is not None]
        booked = sum(len(audit.get(r, {}).get("bookings", [])) for r in rnds) if gw else 0
        decisions = sorted({audit[r]["decision"] + (":" + "+".join(audit[r]["reasons"]) if audit[r]["reasons"]
                                                    else "") for r in rnds if r in audit}) if gw else []
        std_txt, eps_txt = "-", "-"
        d = {"rounds": rnds, "replies": replies, "failures": failures, "released": len(released),
             "bookings": booked, "gateway_decisions": decisions}
        noise = [np.asarray(recs[r]["output"]) - np.asarray(aggs[r]) for r in released if r in aggs]
        if noise and flower_dp and not gw:
            std, (lo, hi) = chi2_std_ci(noise, alpha)
            n_rep = [len(recs[r]["replied"]) for r in released]
            n_min = min(n_rep)
            calibrated = f.flower_sigma * f.flower_clip / m
            needed = f.flower_sigma * f.flower_clip / n_min
            delivered = f.flower_sigma * n_min / m
            eps_claim, eps_real = eps_of(f.flower_sigma, f.delta), eps_of(delivered, f.delta)
            std_txt = (f"{std:.4f} [{lo:.4f}, {hi:.4f}] (Flower's calibration to m={m}: {calibrated:.4f}; "
                       f"needed for its claim at n={n_min}: {needed:.4f})")
            eps_txt = f"claimed {eps_claim:.2f}, delivered {eps_real:.2f} (multiplier {delivered:.3f})"
            d.update(noise_std_measured=std, noise_std_ci=[lo, hi], noise_std_calibrated=calibrated,
                     noise_std_needed=needed, replies_released=n_rep, eps_claimed=eps_claim,
                     eps_delivered=eps_real, samples=int(sum(x.size for x in noise)))
        elif gw:
            eps_txt = "nothing booked" if booked == 0 else f"{booked} bookings"
        warn = sum("differs from the number of sampled clients" in w for r in rnds
                   for w in recs.get(r, {}).get("warnings", []))
        d["flower_reply_count_warnings"] = warn
        rows.append([label, kind, len(rnds), ", ".join(f"{x}/{m}" for x in replies), ", ".join(map(str, failures)),
                     f"{len(released)}/{len(rnds)}", std_txt, eps_txt,
                     ", ".join(decisions) if gw else f"{warn} reply-count warning(s)"])
        out[kind] = d
    return rows, out


def ledger_check(run_out, delta) -> dict:
    """Nothing lost: the ledger's principal and total spend equal the composition of the admitted rounds."""
    import dp_accounting

    from fedmem.dp import Accountant  # lazy: loads dp_accounting (~110 ms)

    gw = run_out["gateway"]
    admitted = [a for a in gw["audit"] if a["decision"] == "admitted"]
    ref = Accountant("rdp")
    for _ in admitted:
        ref.book(dp_accounting.GaussianDpEvent(gw["multiplier"]), "ref")
    want = ref.spent(delta) if admitted else 0.0
    return {"admitted": len(admitted), "bookings": sum(len(a["bookings"]) for a in gw["audit"]),
            "principal_spent": gw["spent"], "total_spent": gw["total_spent"], "expected": want,
            "consistent": bool(math.isclose(gw["spent"], want, rel_tol=1e-9, abs_tol=1e-12)
                               and math.isclose(gw["total_spent"], want, rel_tol=1e-9, abs_tol=1e-12)
                               and sum(len(a["bookings"]) for a in gw["audit"]) == 2 * len(admitted))}


def explain_faults(faults, m) -> str:
    lines = []
    st = faults.get("stock", {})
    if "fail" in st:
        x = st["fail"]
        lines.append(f"- Stock Flower, a ClientApp raises: the workflow reports {', '.join(map(str, x['failures']))} "
                     f"failure(s) per round for one "
                     f"client (SecAgg+ appends a masked-vector-stage error twice) and Flower's "
                     f"DifferentialPrivacyClientSideFixedClipping returns no aggregate when there are failures: "
                     f"{x['released']}/{len(x['rounds'])} released.")
    if "dropout" in st:
        x = st["dropout"]
        s = (f"- Stock Flower, silent dropout: {', '.join(map(str, x['replies']))} replies of {m}, no failure, and "
             f"Flower's DP wrapper "
             f"aggregates what came: {x['released']}/{len(x['rounds'])} released, with "
             f"{x['flower_reply_count_warnings']} reply-count warning(s) in the log.")
        if "noise_std_measured" in x:
            s += (f" The noise it added has std {x['noise_std_measured']:.4f} (95% CI {x['noise_std_ci'][0]:.4f}.."
                  f"{x['noise_std_ci'][1]:.4f}, {x['samples']} samples), i.e. calibrated to num_sampled_clients "
                  f"({x['noise_std_calibrated']:.4f}), while the mean over {min(x['replies_released'])} replies needs "
                  f"{x['noise_std_needed']:.4f} for the claimed epsilon: delivered {x['eps_delivered']:.2f} vs "
                  f"claimed {x['eps_claimed']:.2f} per round. Flower only warns; there is no strict mode.")
        lines.append(s)
    for k, v in faults.items():
        if k == "stock":
            continue
        led = v.get("ledger", {})
        rel = sum(v[x]["released"] for x in ("fail", "dropout") if x in v)
        bk = sum(v[x]["bookings"] for x in ("fail", "dropout") if x in v)
        dec = sorted({d for x in ("fail", "dropout") if x in v for d in v[x]["gateway_decisions"]})
        lines.append(f"- {k}: fault rounds released {rel}, booked {bk} ({', '.join(dec)}); ledger: "
                     f"{led.get('admitted')} admitted rounds, {led.get('bookings')} bookings, principal spent "
                     f"{led.get('principal_spent', float('nan')):.2f} = composition of the admitted rounds "
                     f"{led.get('expected', float('nan')):.2f}: {'consistent' if led.get('consistent') else 'MISMATCH'}.")
    return "\n".join(lines) if lines else "No fault rounds."

