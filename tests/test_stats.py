"""corp.algorithms.stats against hand-computed cases and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from corp.algorithms.stats import (
    PerExample,
    assert_same_examples,
    compare_paired,
    mcnemar_exact,
    paired_bootstrap_ci,
    zscore,
)
from corp.errors import CorpError


@pytest.mark.parametrize(
    "only_a, only_b, both, neither", [(8, 2, 10, 5), (0, 3, 1, 1), (5, 5, 0, 0), (12, 0, 3, 3), (1, 0, 0, 0)]
)
def test_mcnemar_exact_equals_binomial_test(only_a, only_b, both, neither):
    a = [1] * only_a + [0] * only_b + [1] * both + [0] * neither
    b = [0] * only_a + [1] * only_b + [1] * both + [0] * neither
    p, na, nb = mcnemar_exact(a, b)
    assert (na, nb) == (only_a, only_b)
    assert p == pytest.approx(binomtest(only_a, only_a + only_b, 0.5).pvalue, rel=1e-12)


def test_mcnemar_by_hand():
    # 3 discordant pairs, all one way: p = 2 * (1/2)^3 = 0.25; no discordant pairs: p = 1
    assert mcnemar_exact([1, 1, 1, 0], [0, 0, 0, 0])[0] == pytest.approx(0.25)
    assert mcnemar_exact([1, 0], [1, 0])[0] == 1.0


def test_paired_bootstrap_by_hand():
    assert paired_bootstrap_ci([1, 1, 1], [0, 0, 0]) == (1.0, 1.0)
    assert paired_bootstrap_ci([1, 0, 1, 0], [1, 0, 1, 0]) == (0.0, 0.0)
    a, b = [1, 1, 0, 1, 0, 1, 1, 0] * 8, [0, 1, 0, 1, 0, 0, 1, 0] * 8
    lo, hi = paired_bootstrap_ci(a, b)
    assert lo < np.mean(a) - np.mean(b) < hi and (lo, hi) == paired_bootstrap_ci(a, b), (
        "fixed seed: the same interval every time"
    )
    # the bootstrap distribution of a mean of 64 iid differences: close to the normal interval
    d = np.array(a) - np.array(b)
    se = d.std() / np.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.02) and hi == pytest.approx(d.mean() + 1.96 * se, abs=0.02)


def test_compare_paired_refuses_different_examples():
    a, b = PerExample([1, 0], ["x1", "x2"]), PerExample([1, 1], ["x1", "x3"])
    with pytest.raises(CorpError, match="different examples"):
        compare_paired("a", a, "b", b)
    c = compare_paired("a", a, "b", PerExample([0, 0], ["x1", "x2"]))
    assert c["difference"] == 0.5 and c["a_only_correct"] == 1 and c["b_only_correct"] == 0 and c["mcnemar_p"] == 1.0


def test_assert_same_examples_needs_the_same_order():
    with pytest.raises(CorpError, match="position 0"):
        assert_same_examples(PerExample([1, 2], ["a", "b"]), PerExample([2, 1], ["b", "a"]))


def test_zscore_is_zero_when_all_equal_and_used_by_es():
    from corp.methods.es import fitness

    assert not zscore([0.3, 0.3, 0.3]).any()
    assert not zscore([1e6 + 0.1] * 4).any(), "rounding noise of a large equal value is not a signal"
    r = [0.0, 1.0, 0.5, 0.25]
    assert np.array_equal(fitness(r, "zscore"), zscore(r))
    z = zscore(r)
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12


def test_interval_over_seeds_resamples_seeds_not_just_examples():
    """Planted: a method that gains 40 points in one seed of three and nothing in the others. Pooling
    the 3 x 200 pairs as independent gives an interval far from 0; resampling seeds first does not."""
    from corp.algorithms.stats import clustered_bootstrap_ci, compare_paired_seeds, paired_bootstrap_ci

    base = [[i % 2 for i in range(200)] for _ in range(3)]
    method = [[1] * 200, list(base[1]), list(base[2])]  # seed 0: +0.5 on half its examples; seeds 1, 2: identical
    pooled = paired_bootstrap_ci([x for g in method for x in g], [x for g in base for x in g])
    assert pooled[0] > 0.1, "the pooled interval claims a sure gain"
    lo, hi = clustered_bootstrap_ci(method, base)
    assert lo <= 0.0 < hi, (lo, hi)
    c = compare_paired_seeds("m", method, "b", base)
    # the bench's interval is the seeds x examples t interval: also contains 0 here
    assert c["ci95"][0] < 0.0 < c["ci95"][1] and c["n_seeds"] == 3 and abs(c["difference"] - 0.5 / 3) < 1e-12
    assert [p["difference"] for p in c["per_seed"]] == [0.5, 0.0, 0.0] and c["signs"] == {"+": 1, "-": 0, "0": 2}
    assert (
        c["per_seed"][0]["ci95"] == list(paired_bootstrap_ci(method[0], base[0]))
        and c["per_seed"][0]["a_only_correct"] == 100
    )
    one = compare_paired_seeds("m", method[:1], "b", base[:1])  # one seed: the plain paired bootstrap
    assert one["ci95"] == list(paired_bootstrap_ci(method[0], base[0]))


def test_mcnemar_at_5000_discordant_pairs():
    """2.0 ** n overflowed a float from 1024 discordant pairs (the GPU config has 3 x 1319 GSM8K pairs)."""
    a = [1] * 2600 + [0] * 2400 + [1] * 500
    b = [0] * 2600 + [1] * 2400 + [1] * 500
    p, na, nb = mcnemar_exact(a, b)
    assert (na, nb) == (2600, 2400) and 0 < p < 0.01
    assert p == pytest.approx(binomtest(2600, 5000, 0.5).pvalue, rel=1e-9)
    assert mcnemar_exact(a[:5000:2] + a[1:5000:2], b[:5000:2] + b[1:5000:2])[0] == pytest.approx(p)


def test_seed_example_interval_by_hand():
    from scipy.stats import t

    from corp.algorithms.stats import seed_example_interval

    a = [[1, 1, 0, 1], [1, 0, 0, 1], [1, 1, 1, 1]]
    b = [[0, 1, 0, 1]] * 3
    d = np.array(a) - np.array(b)
    m_seed, m_ex = d.mean(axis=1), d.mean(axis=0)
    se = np.sqrt(m_seed.var(ddof=1) / 3 + m_ex.var(ddof=1) / 4)
    iv = seed_example_interval(a, b)
    assert iv["df"] == 2 and iv["mean"] == pytest.approx(d.mean())
    assert iv["ci"] == pytest.approx((d.mean() - t.ppf(0.975, 2) * se, d.mean() + t.ppf(0.975, 2) * se))
    # its own two-sided test: the p at which the interval would just touch 0
    assert iv["p"] == pytest.approx(2 * t.sf(abs(d.mean()) / se, 2))
    lo_at_p = seed_example_interval(a, b, level=1 - iv["p"])["ci"]
    assert min(abs(x) for x in lo_at_p) == pytest.approx(0.0, abs=1e-9)


def test_holm_by_hand():
    """Hand-worked: p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted 0.005, 0.01, 0.03, 0.04, times 4, 3, 2, 1:
    0.02, 0.03, 0.06, 0.04, then the running maximum: 0.02, 0.03, 0.06, 0.06. At 0.05 the first two are
    rejected; uncorrected, all four would be (0.04 and 0.03 < 0.05)."""
    from corp.algorithms.stats import holm

    out = holm([0.01, 0.04, 0.03, 0.005])
    assert [o["p_holm"] for o in out] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [o["reject"] for o in out] == [True, False, False, True]
    # Holm rejects where Bonferroni (each p x m) would not: 0.015 x 3 = 0.045 but 0.04 x 3 = 0.12, Holm 0.04
    out = holm([0.012, 0.015, 0.04])
    assert [o["p_holm"] for o in out] == pytest.approx([0.036, 0.036, 0.04])
    assert all(o["reject"] for o in out)
    # a comparison not run yet still counts in m, and is never rejected
    out = holm([0.02, None])
    assert out[0]["p_holm"] == pytest.approx(0.04) and out[0]["reject"]
    assert out[1] == {"p": None, "p_holm": None, "reject": False}
    assert [o["p_holm"] for o in holm([0.6, 0.9])] == pytest.approx([1.0, 1.0]), "capped at 1"


def _coverage_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "interval_coverage", Path(__file__).resolve().parents[1] / "benchmarks" / "interval_coverage.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("regime", ["seed-dominated", "example-dominated"])
def test_across_seed_interval_covers_a_planted_effect(regime):
    """A known effect planted in simulated bench comparisons (benchmarks/interval_coverage.py's model:
    the same test examples in every seed, a greedy baseline, a method whose run varies by seed and
    whose gain varies by example): the bench's interval covers it in >= 90% of 300 datasets at 5
    seeds and at 3. The same simulation catches intervals that undercover: the old seeds-then-examples
    bootstrap at 3 seeds when the seed term dominates, a t over seeds alone when the example term does."""
    from corp.algorithms.stats import clustered_bootstrap_ci, crossed_t_intervals

    cov = _coverage_script()
    spec = cov.REGIMES[regime]
    truth = cov.true_effect(spec, draws=1_000_000)
    for k in (5, 3):
        a, b = cov.simulate(spec, 300, k, 300, seed=7 + k)
        assert abs((a - b).mean() - truth) < 0.01, "the simulation's mean difference is not the planted effect"
        iv = crossed_t_intervals(a - b)
        assert ((iv["lo"] <= truth) & (truth <= iv["hi"])).mean() >= 0.90, (regime, k)
    if regime == "seed-dominated":
        a, b = cov.simulate(spec, 80, 3, 300, seed=3)
        hits = sum(
            lo <= truth <= hi
            for lo, hi in (clustered_bootstrap_ci(list(a[i]), list(b[i]), samples=1000, seed=i) for i in range(80))
        )
        assert hits / 80 < 0.90, "the old bootstrap's undercoverage at 3 seeds is not visible: this test could not fail"
    else:
        assert cov.coverage_t_over_seeds(*cov.simulate(spec, 300, 5, 300, seed=5), truth) < 0.90
