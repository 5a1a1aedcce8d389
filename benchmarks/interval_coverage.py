"""Coverage of the bench's across-seed intervals, by simulation (issue 22).

A known effect is planted in simulated bench comparisons and each interval's coverage (the share
of simulated datasets whose 95% interval contains the true effect) is counted:
  - `seed-example t` (corp.algorithms.stats.seed_example_interval, what the bench reports now): a t interval
    over the seeds' mean paired differences plus the test examples' sampling term;
  - `seeds-then-examples bootstrap` (corp.algorithms.stats.clustered_bootstrap_ci, what the bench reported
    before): a percentile bootstrap that resamples seeds, then examples within each seed;
  - `t over seeds only`: the t interval over per-seed means alone (k - 1 df), for reference.

The data-generating model mirrors a bench comparison: n test examples drawn once from a task
(the same in every seed), a baseline b that is deterministic given the example (greedy base:
one outcome per example, the same in every seed), and a method a whose run differs by seed
(training randomness: a per-seed shift of its logit, sd `seed_sd`) and whose gain varies by
example (sd `effect_sd`). p_b = sigmoid(u), p_a = sigmoid(u + delta_i + g_s), u ~ N(logit(base), ex_sd).
The true effect is E[p_a - p_b] over examples and seeds (Monte Carlo, 4e6 draws). Two regimes:
`seed-dominated` (seed_sd 0.8: per-seed differences as spread as the CPU bench's CoRP vs GRPO,
+0.37 / +0.02 / +0.12) and `example-dominated` (seed_sd 0.05).

    python benchmarks/interval_coverage.py --out results/interval-coverage
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from corp.algorithms.stats import clustered_bootstrap_ci, crossed_t_intervals

REGIMES = {
    "seed-dominated": {"base": 0.3, "ex_sd": 1.5, "delta": 0.3, "effect_sd": 0.5, "seed_sd": 0.8},
    "example-dominated": {"base": 0.3, "ex_sd": 1.5, "delta": 0.3, "effect_sd": 1.0, "seed_sd": 0.05},
}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def true_effect(regime: dict, draws: int = 4_000_000, seed: int = 12345) -> float:
    rng = np.random.default_rng(seed)
    u = np.log(regime["base"] / (1 - regime["base"])) + regime["ex_sd"] * rng.standard_normal(draws)
    d = regime["delta"] + regime["effect_sd"] * rng.standard_normal(draws)
    g = regime["seed_sd"] * rng.standard_normal(draws)
    return float((_sigmoid(u + d + g) - _sigmoid(u)).mean())


def simulate(regime: dict, datasets: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes a (datasets, k, n) and b (datasets, k, n) of `datasets` simulated comparisons."""
    rng = np.random.default_rng(seed)
    u = np.log(regime["base"] / (1 - regime["base"])) + regime["ex_sd"] * rng.standard_normal((datasets, 1, n))
    d = regime["delta"] + regime["effect_sd"] * rng.standard_normal((datasets, 1, n))
    g = regime["seed_sd"] * rng.standard_normal((datasets, k, 1))
    b = (rng.random((datasets, 1, n)) < _sigmoid(u)).astype(np.float64)
    a = (rng.random((datasets, k, n)) < _sigmoid(u + d + g)).astype(np.float64)
    return a, np.broadcast_to(b, a.shape)


def coverage_seed_example_t(a, b, truth: float) -> float:
    iv = crossed_t_intervals(a - b)
    return float(((iv["lo"] <= truth) & (truth <= iv["hi"])).mean())


def coverage_t_over_seeds(a, b, truth: float) -> float:
    from scipy.stats import t

    m = (a - b).mean(axis=2)
    k = m.shape[1]
    half = t.ppf(0.975, k - 1) * m.std(axis=1, ddof=1) / np.sqrt(k)
    return float((np.abs(m.mean(axis=1) - truth) <= half).mean())


def coverage_bootstrap(a, b, truth: float, samples: int) -> float:
    hits = 0
    for i in range(a.shape[0]):
        lo, hi = clustered_bootstrap_ci(list(a[i]), list(b[i]), samples=samples, seed=i)
        hits += lo <= truth <= hi
    return hits / a.shape[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", type=int, default=1000, help="simulated comparisons per (regime, seeds)")
    ap.add_argument("--boot-datasets", type=int, default=300, help="of those, how many the (slow) bootstrap is run on")
    ap.add_argument(
        "--boot-samples", type=int, default=2000, help="bootstrap resamples per interval (the bench used 10000)"
    )
    ap.add_argument("--n", type=int, default=300, help="test examples")
    ap.add_argument("--out", default="results/interval-coverage")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, regime in REGIMES.items():
        truth = true_effect(regime)
        for k in (3, 5):
            a, b = simulate(regime, args.datasets, k, args.n, seed=1000 + k)
            t0 = time.perf_counter()
            iv = crossed_t_intervals(a - b)
            row = {
                "regime": name,
                **regime,
                "true_effect": truth,
                "seeds": k,
                "n": args.n,
                "datasets": args.datasets,
                "seed_example_t": coverage_seed_example_t(a, b, truth),
                "t_over_seeds": coverage_t_over_seeds(a, b, truth),
                "mean_half_width_seed_example_t": float(((iv["hi"] - iv["lo"]) / 2).mean()),
            }
            if k == 3 or name == "seed-dominated":
                row["bootstrap"] = coverage_bootstrap(
                    a[: args.boot_datasets], b[: args.boot_datasets], truth, args.boot_samples
                )
                row["bootstrap_datasets"] = args.boot_datasets
                row["bootstrap_samples"] = args.boot_samples
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(json.dumps(row))
    (out / "coverage.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/interval_coverage.py "
                + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    lines = [
        "| regime | seeds | true effect | seed-example t (new) | "
        "t over seeds only | seeds-then-examples bootstrap (old) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        boot = f"{r['bootstrap']:.3f} ({r['bootstrap_datasets']} datasets)" if "bootstrap" in r else "—"
        lines.append(
            f"| {r['regime']} | {r['seeds']} | {r['true_effect']:+.4f} | "
            f"{r['seed_example_t']:.3f} | {r['t_over_seeds']:.3f} | {boot} |"
        )
    (out / "coverage.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
