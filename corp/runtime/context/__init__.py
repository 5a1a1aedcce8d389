"""The run layer: the run context, opening a run, and the one evaluation cache every method uses.

Every method imports its run layer from here: `open_run` / `setup_run` (resolve task, splits and
reward, lock the run directory, refuse a directory made under another definition
(`population_definition`, `check_meta`) before writing anything), `RunContext`, `EvalCache`,
`cached_eval` and `run_evals`. Scoring a population of specialists is `corp/evaluate/scorer.py`,
above this package. One job per file:

- `run_context.py`: `RunContext` (config, task, splits, run directory, reward, backend);
- `lifecycle.py`: `setup_run` and `open_run` (the lock, SIGTERM as an interrupt, complete / failed);
- `finish.py`: what a run writes as it ends (the model card, --report-to's export);
- `meta.py`: what defines a run directory's rows, and the check that refuses another definition;
- `keys.py`: an evaluation's identity and key, and the seeds of sampled evaluations;
- `rows.py`: one model's outcome (`EvalResult`) and the one row schema of every cached evaluation;
- `evaluation.py`: generate and score (`evaluate`, `evaluate_current`, `score_one`);
- `cache.py`: `EvalCache` and `cached_eval`.

The evaluation cache (`EvalCache` + `cached_eval`): every cached evaluation of every method is a row
of one schema (`result_row`) in a JSONL file, keyed by a hash of everything that defines it
(`eval_identity`): the model id and its weights hash, the backend, the task signature (including
the content hash of file-backed data), the reward, the exact example ids (a hash of the ordered id
list), what was evaluated (`what`: "base", the fingerprint of a direction's seed components, or a
method's checkpoint label), and the generation settings (max_new_tokens, temperature, n; for a
sampled evaluation also the sampling seed and the version of its derivation, `SAMPLING`). A lookup
with other examples, weights or settings is another key, so it is evaluated afresh: a row is never
paired with examples it was not computed on. `row_scores` returns per-example rewards as a
`corp.algorithms.stats.PerExample` carrying those ids, which the paired gate checks.

Seeded sampling (`sampling_seeds`): a sampled evaluation (temperature > 0: self-consistency,
`corp eval`'s pass@k) gives example e of the evaluation of `what` the prompt seed
sha256("corp-eval-sample", run seed, what, e's id) (63 bits), and its completion j is drawn from
`completion_seed(prompt seed, j)` (corp.runtime.backends.base). So a sample depends on the run's
`--seed`, the model evaluated and the example, never on the batch it shared or on the order a
resumed run evaluates in; the seed is part of the row's key, so rows of two seeds never mix.
"""

from corp.runtime.context.cache import EVALS_FILE, EvalCache, cached_eval, run_evals, shared_salt
from corp.runtime.context.evaluation import EvalResult, evaluate, evaluate_current, score_generations, score_one
from corp.runtime.context.keys import (
    SAMPLING,
    direction_fingerprint,
    eval_identity,
    eval_key,
    ids_hash,
    sampling_seeds,
    specialist_what,
)
from corp.runtime.context.lifecycle import open_run, setup_run
from corp.runtime.context.meta import (
    META_FILE,
    META_FORMAT,
    POPULATION_FILE,
    POPULATION_ORDER,
    check_meta,
    compare_meta,
    default_definition,
    population_definition,
    run_scheme,
)
from corp.runtime.context.rows import ROW_FORMAT, TIMING_FIELDS, result_row, row_scores, shareable
from corp.runtime.context.run_context import RunContext, engine_options

__all__ = [
    "EVALS_FILE",
    "META_FILE",
    "META_FORMAT",
    "POPULATION_FILE",
    "POPULATION_ORDER",
    "TIMING_FIELDS",
    "ROW_FORMAT",
    "SAMPLING",
    "EvalCache",
    "EvalResult",
    "RunContext",
    "cached_eval",
    "check_meta",
    "compare_meta",
    "default_definition",
    "direction_fingerprint",
    "engine_options",
    "eval_identity",
    "eval_key",
    "evaluate",
    "evaluate_current",
    "ids_hash",
    "open_run",
    "population_definition",
    "result_row",
    "row_scores",
    "run_evals",
    "run_scheme",
    "sampling_seeds",
    "score_generations",
    "score_one",
    "setup_run",
    "shareable",
    "shared_salt",
    "specialist_what",
]
