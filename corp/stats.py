"""Small statistics shared by every method: z-scores, paired comparisons, per-example score lists.

A neutral low-level module (numpy and scipy only, no corp imports beyond the error type), so that
the run layer, ES, CoRP and the split-half analysis can all use the same definitions:

- `zscore`: (x - mean) / sd with the population sd (ddof = 0); when every value is equal (sd is 0
  up to rounding) it returns zeros, never NaN or an error: no spread means no signal, and a
  fitness or weight of 0 for everyone is the neutral answer. ES fitness, CoRP's compatibility
  terms and the analysis use this one function.
- `paired_bootstrap_ci`: the percentile bootstrap 95% interval of mean(a) - mean(b) over examples
  resampled jointly (paired), with a fixed seed so a report is reproducible.
- `mcnemar_exact`: the exact (binomial) two-sided McNemar test on paired 0/1 outcomes: under the
  null the discordant pairs split 50/50, p = P(|B - n/2| >= |b - n/2|) for B ~ Binomial(n, 1/2),
  the same number as `scipy.stats.binomtest(b, n, 0.5).pvalue`.
- `PerExample`: a list of per-example scores that remembers which example ids it was computed
  on, and `assert_same_examples`, which every paired comparison (the CoRP gate included) calls so
  that it can never subtract scores of different examples.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from corp import CorpError

BOOTSTRAP_SAMPLES = 10_000
BOOTSTRAP_SEED = 0


def zscore(values: Sequence[float]) -> np.ndarray:
    """(x - mean) / sd (population sd); zeros when all values are equal (sd 0 up to rounding)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    sd = x.std()
    if not np.isfinite(sd) or sd < 1e-12 * max(1.0, float(np.abs(x).max())):
        return np.zeros_like(x)
    return (x - x.mean()) / sd


class PerExample(list):
    """Per-example scores plus the ids of the examples they were computed on (in order)."""

    def __init__(self, values: Sequence[float], example_ids: Sequence[str]):
        super().__init__(values)
        if len(example_ids) != len(self):
            raise ValueError(f"{len(self)} scores for {len(example_ids)} example ids")
        self.example_ids = list(example_ids)


def assert_same_examples(a: Sequence, b: Sequence, what: str = "paired comparison") -> None:
    """Refuse to pair two per-example lists unless they cover the same example ids in the same order.

    Lists without ids (plain lists) are checked for length only: a caller that does not know its
    ids cannot be checked further, but a `PerExample` is always checked against the other side.
    """
    ids_a, ids_b = getattr(a, "example_ids", None), getattr(b, "example_ids", None)
    if len(a) != len(b):
        raise CorpError(f"{what}: the two sides have {len(a)} and {len(b)} examples; they must be scored on the same examples")
    if ids_a is None and ids_b is None:
        return
    if ids_a is None or ids_b is None:
        raise CorpError(f"{what}: one side carries no example ids, so the pairing cannot be checked")
    if list(ids_a) != list(ids_b):
        diff = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
        raise CorpError(f"{what}: the two sides were scored on different examples (first difference at position {diff}: '{ids_a[diff]}' vs '{ids_b[diff]}')")


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b), resampling examples jointly."""
    assert_same_examples(a, b)
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = d.size
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def clustered_bootstrap_ci(groups_a: Sequence[Sequence[float]], groups_b: Sequence[Sequence[float]], level: float = 0.95,
                           samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of mean(a) - mean(b) over several seeds' runs on the same examples: each
    resample draws seeds with replacement, then examples (jointly for a and b) within each drawn
    seed. Pooling seed x example pairs as if independent would ignore that one seed's run moves all
    of its examples together (a method that helps in one seed of three is not a sure gain)."""
    diffs = [np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64) for a, b in zip(groups_a, groups_b, strict=True)]
    if not diffs or any(d.size == 0 for d in diffs):
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    k = len(diffs)
    picks = rng.integers(0, k, size=(samples, k))
    means = np.zeros(samples)
    for j in range(k):  # slot j of each resample: a drawn seed, with its own resample of that seed's examples
        inner = np.stack([d[rng.integers(0, d.size, size=(samples, d.size))].mean(axis=1) for d in diffs])  # (k, samples)
        means += inner[picks[:, j], np.arange(samples)]
    means /= k
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def compare_paired_seeds(name_a: str, groups_a: Sequence[Sequence[int | bool]], name_b: str, groups_b: Sequence[Sequence[int | bool]]) -> dict:
    """`compare_paired` over several seeds (one list of per-example outcomes per seed, the same
    examples in each): the difference of pooled accuracies, its seed-then-example bootstrap interval
    (`clustered_bootstrap_ci`); McNemar's p is over the pooled pairs and so reads one seed as many."""
    for a, b in zip(groups_a, groups_b, strict=True):
        assert_same_examples(a, b, f"{name_a} vs {name_b}")
    out = compare_paired(name_a, [x for g in groups_a for x in g], name_b, [x for g in groups_b for x in g])
    if len(groups_a) > 1:
        out["ci95"] = list(clustered_bootstrap_ci([[int(bool(x)) for x in g] for g in groups_a], [[int(bool(x)) for x in g] for g in groups_b]))
        out["method"] = (f"bootstrap over seeds, then examples within each seed ({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, "
                         "percentile 95%); exact two-sided McNemar on the pooled pairs")
        out["n_seeds"] = len(groups_a)
    return out


def mcnemar_exact(a: Sequence[int | bool], b: Sequence[int | bool]) -> tuple[float, int, int]:
    """Exact two-sided McNemar test on paired 0/1 outcomes: (p, #a right and b wrong, #b right and a wrong)."""
    assert_same_examples(a, b)
    only_a = sum(1 for x, y in zip(a, b) if bool(x) and not bool(y))
    only_b = sum(1 for x, y in zip(a, b) if bool(y) and not bool(x))
    n = only_a + only_b
    if n == 0:
        return 1.0, 0, 0
    k = min(only_a, only_b)
    # two-sided: double the smaller tail of Binomial(n, 1/2), capped at 1 (the binomial is symmetric)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail), only_a, only_b


def compare_paired(name_a: str, correct_a: Sequence[int | bool], name_b: str, correct_b: Sequence[int | bool]) -> dict:
    """Accuracy difference of `name_a` over `name_b` on the same examples, with its paired 95% bootstrap
    interval and the exact McNemar p-value."""
    assert_same_examples(correct_a, correct_b, f"{name_a} vs {name_b}")
    a = [int(bool(x)) for x in correct_a]
    b = [int(bool(x)) for x in correct_b]
    n = len(a)
    lo, hi = paired_bootstrap_ci(a, b)
    p, only_a, only_b = mcnemar_exact(a, b)
    acc_a, acc_b = (sum(a) / n, sum(b) / n) if n else (float("nan"), float("nan"))
    return {
        "a": name_a, "b": name_b, "n": n, "accuracy_a": acc_a, "accuracy_b": acc_b, "difference": acc_a - acc_b,
        "ci95": [lo, hi], "mcnemar_p": p, "a_only_correct": only_a, "b_only_correct": only_b,
        "method": f"paired bootstrap ({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, percentile 95%); exact two-sided McNemar",
    }


def comparison_line(c: dict) -> str:
    if c.get("n_seeds", 1) > 1:  # McNemar on pooled pairs reads one seed's run as many independent ones: not printed
        return (f"{c['a']} vs {c['b']}: {c['difference']:+.3f} (paired 95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}, "
                f"resampling {c['n_seeds']} seeds then examples; {c['a_only_correct']} vs {c['b_only_correct']} discordant; n = {c['n']})")
    return (f"{c['a']} vs {c['b']}: {c['difference']:+.3f} (paired 95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}; "
            f"McNemar p = {c['mcnemar_p']:.3g}, {c['a_only_correct']} vs {c['b_only_correct']} discordant; n = {c['n']})")
