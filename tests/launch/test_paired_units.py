"""The paired comparison of two checkpoints (topo.launch.evaluation.paired), held to independent computations."""
import math
import random

import pytest

from topo.launch.evaluation.paired import compare, mcnemar_p, newcombe, pairs_needed


def exact_mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar p by direct summation of Binomial(b + c, 1/2): twice the smaller tail, at most 1."""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("b,c", [(0, 0), (1, 0), (5, 5), (12, 3), (3, 12), (40, 21), (0, 9), (100, 130)])
def test_the_mcnemar_p_is_the_exact_binomial_tail(b, c):
    assert mcnemar_p(b, c) == pytest.approx(exact_mcnemar(b, c), rel=1e-9, abs=1e-12)


def test_a_comparison_counts_the_discordant_pairs_and_rates():
    a = [True] * 30 + [True] * 12 + [False] * 3 + [False] * 55
    b = [True] * 30 + [False] * 12 + [True] * 3 + [False] * 55
    out = compare(a, b)
    assert out["pairs"] == 100 and out["discordant"] == {"a_only": 12, "b_only": 3}
    assert (out["rate_a"], out["rate_b"], out["difference"]) == (0.42, 0.33, 0.09)
    assert out["mcnemar_p"] == pytest.approx(exact_mcnemar(12, 3))
    lo, hi = out["ci95"]
    assert lo < 0.09 < hi and 0 < lo  # p = 0.035: the interval excludes 0 as the test rejects
    swapped = compare(b, a)
    assert swapped["ci95"] == [-hi, -lo] and swapped["mcnemar_p"] == out["mcnemar_p"]


def test_identical_checkpoints_differ_by_nothing():
    a = [True, False, True, True, False] * 20
    out = compare(a, a)
    assert out["difference"] == 0 and out["mcnemar_p"] == 1.0 and out["ci95"][0] <= 0 <= out["ci95"][1]


def test_newcombes_interval_covers_the_true_difference_as_often_as_it_says():
    """Monte Carlo, seeded: 2,000 paired samples of 80 from a known joint law; the 95 % interval holds the true
    difference in 93-97.5 % of them (a wrong variance or correlation term falls outside)."""
    rng = random.Random(7)
    cells = (0.35, 0.15, 0.05, 0.45)  # both, A only, B only, neither: true difference 0.10
    hits, trials = 0, 2000
    for _ in range(trials):
        counts = [0, 0, 0, 0]
        for _ in range(80):
            counts[rng.choices(range(4), cells)[0]] += 1
        lo, hi = newcombe(*counts)
        hits += lo <= 0.10 <= hi
    assert 0.93 <= hits / trials <= 0.975


@pytest.mark.parametrize("delta,psi", [(0.05, 0.2), (0.1, 0.1), (0.2, 0.3)])
def test_pairs_needed_reach_the_power_they_claim(delta, psi):
    """The normal approximation behind Connor's formula, checked by its own definition: at the n it returns, the
    power of the two-sided 5 % test is >= 80 %, and at n - 1 it is below."""
    from scipy.stats import norm

    def power(n):
        return norm.cdf((abs(delta) * math.sqrt(n) - 1.959964 * math.sqrt(psi)) / math.sqrt(psi - delta ** 2))

    n = pairs_needed(delta, psi)
    assert power(n) >= 0.8 - 1e-6 and power(n - 1) < 0.8


def test_detect_says_whether_the_run_had_enough_pairs():
    a, b = [True] * 60 + [False] * 40, [True] * 50 + [False] * 50
    out = compare(a, b, detect=0.05)
    assert out["detect"]["pairs_needed"] == pairs_needed(0.05, 0.1) and out["detect"]["enough"] is False
    assert compare(a * 50, b * 50, detect=0.05)["detect"]["enough"] is True
    with pytest.raises(ValueError):
        pairs_needed(0, 0.1)
