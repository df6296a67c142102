"""The hostile-ClientApp family (fedmem.attacks.malicious_client) against fedmem's Flower wrappers.

Each attack runs against the wrapper (both APIs) and must hold (no LEAK by the shared verdict rule,
failed closed in every trial, no value in any text); the SAME check must reject its companion
broken variant (the pre-issue-37 wrapper with one defect switched on)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedmem.attacks.malicious_client import ATTACKS, BROKEN, run_attack  # noqa: E402

FAST = [a for a in ATTACKS if a != "release_timing"]


def _check(row) -> bool:
    """The one test every row (defended or broken) goes through."""
    return row.holds()


@pytest.mark.parametrize("api", ["legacy", "message"])
@pytest.mark.parametrize("attack", FAST)
def test_hostile_client_attacks_hold_against_the_wrapper(attack, api):
    row = run_attack(attack, api=api, trials=60, seed=1)
    assert _check(row), row.as_dict()
    if attack == "non_finite":
        assert row.released == (0, 0)            # refused in both worlds, nothing booked
    else:
        assert row.released == (60, 60)          # clipped, released and booked in both worlds


@pytest.mark.parametrize("attack", FAST)
def test_the_same_check_catches_each_broken_variant(attack):
    row = run_attack(attack, trials=60, seed=1, broken=True)
    assert not _check(row), row.as_dict()
    assert row.variant.startswith("broken")


def test_range_limit_oracle_broken_variant_reads_the_exact_sum_and_the_wrapper_does_not():
    broken = run_attack("range_limit_oracle", trials=40, seed=2, broken=True)
    assert broken.values_in_text == 40 and broken.escaped == 40      # every world-1 round: the sum in the text
    assert broken.verdict.label == "LEAK"
    fixed = run_attack("range_limit_oracle", trials=40, seed=2)
    assert fixed.values_in_text == 0 and fixed.escaped == 0


def test_client_side_clipping_refuses_the_out_of_contract_reply_in_both_worlds():
    row = run_attack("range_limit_oracle", trials=40, seed=3, clipping="client")
    assert _check(row) and row.released == (0, 0)


@pytest.mark.slow
def test_release_timing_of_neighbouring_replies_has_power_and_holds():
    """In process, worlds interleaved at random; the broken variant (math.fsum per coordinate, whose time
    depends on the values) must be caught by the same check, with the same parameters. Slow (about a minute):
    at 250 trials per world the fsum variant was caught on idle cores but not at load 5-7 on the 2 shared
    cores (AUC 0.65-0.70 there, held-out eps >= 0.09 < 0.55); 800 trials measured AUC 0.76, LEAK at eps >= 1.75."""
    kw = dict(trials=800, dim=2048, repeats=5, noise_multiplier=8.0, seed=4)
    broken = run_attack("release_timing", broken=True, **kw)
    assert not _check(broken), broken.as_dict()
    row = run_attack("release_timing", **kw)
    assert _check(row), row.as_dict()


def test_run_attack_names_bad_arguments():
    with pytest.raises(ValueError, match="attack must be one of"):
        run_attack("nope")
    with pytest.raises(ValueError, match="clock must be one of"):
        run_attack("release_timing", clock="sundial")
    with pytest.raises(ValueError, match="api must be 'legacy' for a broken variant"):
        run_attack("non_finite", api="message", broken=True)
    assert set(BROKEN) == set(ATTACKS)
