"""corp.stats against hand-computed cases and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from corp import CorpError
from corp.stats import PerExample, assert_same_examples, compare_paired, mcnemar_exact, paired_bootstrap_ci, zscore


@pytest.mark.parametrize("only_a, only_b, both, neither", [(8, 2, 10, 5), (0, 3, 1, 1), (5, 5, 0, 0), (12, 0, 3, 3), (1, 0, 0, 0)])
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
    assert lo < np.mean(a) - np.mean(b) < hi and (lo, hi) == paired_bootstrap_ci(a, b), "fixed seed: the same interval every time"
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
    from corp.baselines.es import fitness

    assert not zscore([0.3, 0.3, 0.3]).any()
    assert not zscore([1e6 + 0.1] * 4).any(), "rounding noise of a large equal value is not a signal"
    r = [0.0, 1.0, 0.5, 0.25]
    assert np.array_equal(fitness(r, "zscore"), zscore(r))
    z = zscore(r)
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12


def test_interval_over_seeds_resamples_seeds_not_just_examples():
    """Planted: a method that gains 40 points in one seed of three and nothing in the others. Pooling
    the 3 x 200 pairs as independent gives an interval far from 0; resampling seeds first does not."""
    from corp.stats import clustered_bootstrap_ci, compare_paired_seeds, paired_bootstrap_ci

    base = [[i % 2 for i in range(200)] for _ in range(3)]
    method = [[1] * 200, list(base[1]), list(base[2])]  # seed 0: +0.5 on half its examples; seeds 1, 2: identical
    pooled = paired_bootstrap_ci([x for g in method for x in g], [x for g in base for x in g])
    assert pooled[0] > 0.1, "the pooled interval claims a sure gain"
    lo, hi = clustered_bootstrap_ci(method, base)
    assert lo <= 0.0 < hi, (lo, hi)
    c = compare_paired_seeds("m", method, "b", base)
    assert c["ci95"] == [lo, hi] and c["n_seeds"] == 3 and abs(c["difference"] - 0.5 / 3) < 1e-12
    one = compare_paired_seeds("m", method[:1], "b", base[:1])  # one seed: the plain paired bootstrap
    assert one["ci95"] == list(paired_bootstrap_ci(method[0], base[0]))
