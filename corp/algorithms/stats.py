"""Small statistics shared by every method: z-scores, paired comparisons, per-example score lists.

A neutral low-level module (numpy and scipy only, no corp imports beyond the error type), so that
the run layer, ES, CoRP and the split-half analysis can all use the same definitions:

- `zscore`: (x - mean) / sd with the population sd (ddof = 0); when every value is equal (sd is 0
  up to rounding) it returns zeros, never NaN or an error: no spread means no signal, and a
  fitness or weight of 0 for everyone is the neutral answer. ES fitness, CoRP's compatibility
  terms and the analysis use this one function.
- `paired_bootstrap_ci`: the percentile bootstrap 95% interval of mean(a) - mean(b) over examples
  resampled jointly (paired), with a fixed seed so a report is reproducible.
- `wilson_interval`: Wilson's score interval of one proportion (an accuracy on n examples);
  `ratio_bootstrap_ci`: the percentile bootstrap of a ratio of sums over units (bits per byte
  over text chunks), alone or as a paired difference on the same units.
- `mcnemar_exact`: the exact (binomial) two-sided McNemar test on paired 0/1 outcomes: under the
  null the discordant pairs split 50/50; p is `scipy.stats.binomtest(b, n, 0.5).pvalue` (summing
  binomial coefficients over 2**n overflowed a float from n = 1024 discordant pairs).
- `seed_example_interval`: the across-seed interval of a paired difference measured by k seeds on
  the same n test examples. A t interval over the k per-seed mean differences (k - 1 degrees of
  freedom) covers the seed-to-seed spread but, with the same test examples in every seed, not the
  sampling of the test examples themselves; so its variance adds the per-example term of a crossed
  seeds x examples design, var(seed means)/k + var(example means over seeds)/n, with k - 1
  degrees of freedom (conservative when the example term dominates; Welch-Satterthwaite's larger
  df undercovered at 3 seeds). With 3 seeds the seed-then-example percentile bootstrap
  (`clustered_bootstrap_ci`, kept for comparison) has 10 distinct seed resamples and cannot leave
  the range of the seed means; benchmarks/interval_coverage.py measures both by simulation. Its
  two-sided p (the same t, k - 1 df) is what `holm` corrects for a pre-registered family.
- `tost`: two one-sided tests of equivalence within a margin declared beforehand (Schuirmann 1987):
  H0 is |difference| >= margin; each side is a one-sided t test, p = the larger of the two, and
  equivalence at level alpha is the (1 - 2 alpha) interval lying inside (-margin, +margin).
  `tost_from` takes a mean, its standard error and df (the across-seed interval's), `tost` a sample.
- `holm`: Holm's step-down adjustment of a family of p-values (strong control of the family-wise
  error rate, no assumption about how the tests depend on each other).
- `PerExample`: a list of per-example scores that remembers which example ids it was computed
  on, and `assert_same_examples`, which every paired comparison (the CoRP gate included) calls so
  that it can never subtract scores of different examples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _scipy_stats

from corp.errors import CorpError

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
        raise CorpError(
            f"{what}: the two sides have {len(a)} and {len(b)} examples; they must be scored on the same examples"
        )
    if ids_a is None and ids_b is None:
        return
    if ids_a is None or ids_b is None:
        raise CorpError(f"{what}: one side carries no example ids, so the pairing cannot be checked")
    if list(ids_a) != list(ids_b):
        diff = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
        raise CorpError(
            f"{what}: the two sides were scored on different examples (first "
            f"difference at position {diff}: '{ids_a[diff]}' vs '{ids_b[diff]}')"
        )


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    level: float = 0.95,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
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


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion (stays inside [0, 1] and is not empty at 0 or n successes)."""
    if n <= 0:
        return (float("nan"), float("nan"))
    z = float(_scipy_stats.norm.ppf(1 - (1 - level) / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # exact at the ends (the formula leaves rounding dust there)
    return (0.0 if successes == 0 else max(0.0, centre - half)), (1.0 if successes == n else min(1.0, centre + half))


def ratio_bootstrap_ci(
    num: Sequence[float],
    den: Sequence[float],
    base_num: Sequence[float] | None = None,
    level: float = 0.95,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(num) / sum(den) over units (e.g. text chunks: bits and
    bytes) resampled with replacement; with `base_num`, of the paired difference
    (sum(num) - sum(base_num)) / sum(den), the same units resampled for both."""
    a = np.asarray(num, dtype=np.float64)
    d = np.asarray(den, dtype=np.float64)
    if base_num is not None:
        a = a - np.asarray(base_num, dtype=np.float64)
    if a.size == 0 or a.size != d.size:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(samples, a.size))
    ratios = a[idx].sum(axis=1) / d[idx].sum(axis=1)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def clustered_bootstrap_ci(
    groups_a: Sequence[Sequence[float]],
    groups_b: Sequence[Sequence[float]],
    level: float = 0.95,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile interval of mean(a) - mean(b) over several seeds' runs on the same examples: each
    resample draws seeds with replacement, then examples (jointly for a and b) within each drawn
    seed. Pooling seed x example pairs as if independent would ignore that one seed's run moves all
    of its examples together (a method that helps in one seed of three is not a sure gain)."""
    diffs = [
        np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
        for a, b in zip(groups_a, groups_b, strict=True)
    ]
    if not diffs or any(d.size == 0 for d in diffs):
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    k = len(diffs)
    picks = rng.integers(0, k, size=(samples, k))
    means = np.zeros(samples)
    for j in range(k):  # slot j of each resample: a drawn seed, with its own resample of that seed's examples
        inner = np.stack(
            [d[rng.integers(0, d.size, size=(samples, d.size))].mean(axis=1) for d in diffs]
        )  # (k, samples)
        means += inner[picks[:, j], np.arange(samples)]
    means /= k
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def seed_example_interval(
    groups_a: Sequence[Sequence[float]], groups_b: Sequence[Sequence[float]], level: float = 0.95
) -> dict:
    """Across-seed interval of mean(a) - mean(b) over k >= 2 seeds' runs on the same n examples
    (see the module docstring): {mean, ci: (lo, hi), df, se, seed_means}."""
    d = np.asarray(
        [
            np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
            for a, b in zip(groups_a, groups_b, strict=True)
        ]
    )
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 2:
        raise ValueError(f"an across-seed interval needs >= 2 seeds on >= 2 shared examples, got shape {d.shape}")
    out = crossed_t_intervals(d[None], level)
    mean, se, df = float(out["mean"][0]), float(out["se"][0]), float(out["df"][0])
    # the interval's own test, two-sided: no spread at all makes any nonzero difference certain
    p = (0.0 if mean else 1.0) if se == 0 else float(2 * _scipy_stats.t.sf(abs(mean) / se, df))
    return {
        "mean": mean,
        "ci": (float(out["lo"][0]), float(out["hi"][0])),
        "df": df,
        "se": se,
        "p": p,
        "seed_means": [float(x) for x in d.mean(axis=1)],
    }


def tost_from(mean: float, se: float, df: float, margin: float, alpha: float = 0.05) -> dict:
    """Two one-sided t tests of |true difference| < margin from an estimate, its standard error and
    df: {p_lower (H0: d <= -margin), p_upper (H0: d >= +margin), p (the larger), ci (the 1 - 2 alpha
    interval), equivalent (p <= alpha)}. No spread (se 0) decides on the mean alone."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    if se == 0:
        p_lo, p_hi = float(mean <= -margin), float(mean >= margin)
        half = 0.0
    else:
        p_lo = float(_scipy_stats.t.sf((mean + margin) / se, df))
        p_hi = float(_scipy_stats.t.sf((margin - mean) / se, df))
        half = float(_scipy_stats.t.ppf(1 - alpha, df)) * se
    p = max(p_lo, p_hi)
    return {
        "mean": float(mean),
        "margin": float(margin),
        "p_lower": p_lo,
        "p_upper": p_hi,
        "p": p,
        "ci": (float(mean) - half, float(mean) + half),
        "level": 1 - 2 * alpha,
        "equivalent": p <= alpha,
    }


def tost(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> dict:
    """`tost_from` on a sample of differences (one per seed, say): mean, sd / sqrt(n), n - 1 df."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        raise ValueError(f"two one-sided tests need >= 2 differences, got {d.size}")
    return tost_from(float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), d.size - 1, margin, alpha)


def holm(pvalues: Sequence[float | None], alpha: float = 0.05) -> list[dict]:
    """Holm's step-down procedure over a family of m hypotheses: sort the p-values, multiply the i-th
    smallest (i = 1..m) by m - i + 1, carry the running maximum (adjusted p-values never decrease
    with rank) and cap at 1; a hypothesis is rejected when its adjusted p is <= alpha. A missing p
    (None: a comparison not run yet) still counts in m and is never rejected, so a family with gaps
    is corrected as registered, not as run. Returns, in input order, {p, p_holm, reject}."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i] is None, pvalues[i] if pvalues[i] is not None else 0.0))
    out: list[dict] = [{} for _ in range(m)]
    running = 0.0
    for rank, i in enumerate(order):
        p = pvalues[i]
        if p is None:
            out[i] = {"p": None, "p_holm": None, "reject": False}
            continue
        running = max(running, min(1.0, (m - rank) * float(p)))
        out[i] = {"p": float(p), "p_holm": running, "reject": running <= alpha}
    return out


def crossed_t_intervals(d: np.ndarray, level: float = 0.95) -> dict:
    """`seed_example_interval` on a stack of datasets, d of shape (datasets, k seeds, n examples):
    vectorised so the coverage simulation (tests, benchmarks/interval_coverage.py) runs the same code."""
    k, n = d.shape[1], d.shape[2]
    mean = d.mean(axis=(1, 2))
    v_seed = d.mean(axis=2).var(axis=1, ddof=1) / k  # the t-over-seeds term
    v_ex = d.mean(axis=1).var(axis=1, ddof=1) / n  # the test examples' own sampling
    var = v_seed + v_ex
    # k - 1 df whatever the example term's share: Welch-Satterthwaite df (up to k + n - 2) covered
    # 0.91 at 3 seeds when the seed term dominated (benchmarks/interval_coverage.py); k - 1 is the
    # t over seeds' own df, and the added example term only widens it
    df = np.full(mean.shape, float(k - 1))
    se = np.sqrt(var)
    half = _scipy_stats.t.ppf(1 - (1 - level) / 2, df) * se
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "df": df, "se": se}


def compare_paired_seeds(
    name_a: str, groups_a: Sequence[Sequence[int | bool]], name_b: str, groups_b: Sequence[Sequence[int | bool]]
) -> dict:
    """`compare_paired` over several seeds (one list of per-example outcomes per seed, the same
    examples in each): the difference of pooled accuracies with its across-seed interval
    (`seed_example_interval`), and per seed the difference with its within-seed paired bootstrap
    interval and exact McNemar p, and the sign count of the per-seed differences. McNemar over the
    pooled pairs would read one seed as many and is not reported for several seeds."""
    for a, b in zip(groups_a, groups_b, strict=True):
        assert_same_examples(a, b, f"{name_a} vs {name_b}")
    out = compare_paired(name_a, [x for g in groups_a for x in g], name_b, [x for g in groups_b for x in g])
    if len(groups_a) > 1:
        ga = [[int(bool(x)) for x in g] for g in groups_a]
        gb = [[int(bool(x)) for x in g] for g in groups_b]
        iv = seed_example_interval(ga, gb)
        out["ci95"] = list(iv["ci"])
        out["df"] = iv["df"]
        out["per_seed"] = [
            {
                k: v
                for k, v in compare_paired(name_a, a, name_b, b).items()
                if k in ("difference", "ci95", "mcnemar_p", "a_only_correct", "b_only_correct")
            }
            for a, b in zip(ga, gb)
        ]
        ds = [p["difference"] for p in out["per_seed"]]
        out["signs"] = {"+": sum(x > 0 for x in ds), "-": sum(x < 0 for x in ds), "0": sum(x == 0 for x in ds)}
        out["mcnemar_p"] = None
        out["method"] = (
            f"t interval over {len(ga)} seeds' mean paired differences plus the test examples' sampling term "
            f"(crossed seeds x examples variance, {iv['df']:.0f} df, 95%); per seed: paired bootstrap "
            f"({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}) and exact McNemar"
        )
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
    return float(_scipy_stats.binomtest(only_a, n, 0.5).pvalue), only_a, only_b


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
        "a": name_a,
        "b": name_b,
        "n": n,
        "accuracy_a": acc_a,
        "accuracy_b": acc_b,
        "difference": acc_a - acc_b,
        "ci95": [lo, hi],
        "mcnemar_p": p,
        "a_only_correct": only_a,
        "b_only_correct": only_b,
        "method": (
            f"paired bootstrap ({BOOTSTRAP_SAMPLES} resamples, seed "
            f"{BOOTSTRAP_SEED}, percentile 95%); exact two-sided McNemar"
        ),
    }


def compare_paired_rewards(name_a: str, rewards_a: Sequence[float], name_b: str, rewards_b: Sequence[float]) -> dict:
    """Mean reward difference of `name_a` over `name_b` on the same examples, with its paired 95% bootstrap
    interval: the comparison of a task without gold answers (no correctness, so no McNemar)."""
    assert_same_examples(rewards_a, rewards_b, f"{name_a} vs {name_b}")
    a, b = np.asarray(rewards_a, dtype=np.float64), np.asarray(rewards_b, dtype=np.float64)
    lo, hi = paired_bootstrap_ci(list(a), list(b))
    mean_a, mean_b = (float(a.mean()), float(b.mean())) if a.size else (float("nan"), float("nan"))
    return {
        "a": name_a,
        "b": name_b,
        "n": int(a.size),
        "measure": "reward",
        "reward_a": mean_a,
        "reward_b": mean_b,
        "difference": mean_a - mean_b,
        "ci95": [lo, hi],
        "method": f"paired bootstrap ({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}, percentile 95%)",
    }


def sign_text(c: dict) -> str:
    """Per-seed sign count, e.g. '3+ 1- 1=' (seeds where a is above b, below it, level; a tie is
    written '=', since '20' for two ties reads as twenty)."""
    s = c.get("signs") or {}
    return " ".join(f"{s[k]}{'=' if k == '0' else k}" for k in ("+", "-", "0") if s.get(k))


def examples_text(c: dict) -> str:
    """The paired outcomes behind a comparison: 'n = 300', or '5 seeds x 300 test examples' (pooled
    pairs are not independent examples)."""
    k = c.get("n_seeds", 1)
    return f"n = {c['n']}" if k <= 1 else f"{k} seeds x {c['n'] // k} test examples"


def comparison_line(c: dict) -> str:
    if c.get("n_seeds", 1) > 1:  # McNemar on pooled pairs reads one seed's run as many independent ones: per seed only
        seeds = ", ".join(f"{p['difference']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]" for p in c["per_seed"])
        return (
            f"{c['a']} vs {c['b']}: {c['difference']:+.3f} (95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f} across "
            f"{c['n_seeds']} seeds, df {c['df']:.1f}; per seed {seeds}; signs {sign_text(c)}; {examples_text(c)})"
        )
    if c.get("measure") == "reward":
        return (
            f"{c['a']} vs {c['b']}: reward {c['difference']:+.3f} (paired 95% CI {c['ci95'][0]:+.3f} to "
            f"{c['ci95'][1]:+.3f}; n = {c['n']})"
        )
    return (
        f"{c['a']} vs {c['b']}: {c['difference']:+.3f} (paired 95% CI {c['ci95'][0]:+.3f} to {c['ci95'][1]:+.3f}; "
        f"McNemar p = {c['mcnemar_p']:.3g}, {c['a_only_correct']} vs {c['b_only_correct']} discordant; n = {c['n']})"
    )
