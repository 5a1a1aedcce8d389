"""The bench's records, typed (issue 38): a cell's record (`CellRecord`, one JSON file per finished cell
under RESULTS_DIR/NAME/cells/), its rows (`CellRow`), and a comparison of two rows over seeds
(`Comparison`, in bench.json and the report's tables).

TypedDicts, not classes: a record is the JSON the bench writes and every later session reads back
(the first and second editions' files included), so the type describes that JSON and adds nothing
to it. `check_record` holds a record to its type when the bench writes one and in the tests, over
every committed record: a field renamed or added without a line here is an error, not a silent
change of format.
"""

# no `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations
import types
import typing
from typing import Any, NotRequired, TypedDict, Union

from corp.errors import CorpError


class CellRow(TypedDict):
    """One row of a cell's report, as the bench keeps it."""

    name: str  # the row's name in the bench (the cell's label, or label:row for a method with several)
    report_row: str  # the row's name in the method's own report
    accuracy: float  # on the bench's test split (the tuning split for a trial)
    passes_per_example: int  # forward generations per test example (vote@K: K)
    labelled_examples: int  # labelled examples the method used
    test_tokens: int  # prompt + generated tokens of its test evaluation
    test_flops: float  # that evaluation's FLOPs (the measurement: never charged to the cell)
    correct: list[int] | None  # per-example outcomes, in example_ids order
    population_row: NotRequired[bool]  # RandOpt's row on this CoRP cell's own population (population_rows)
    flops: NotRequired[float]  # such a row's charge: the scoring of the prefix CoRP read, not CoRP's own evaluations


class CellRecord(TypedDict):
    """A cell: one method, task, data setting, seed and budget (or trial), run to the end or found not to fit."""

    format: int  # RECORD_FORMAT
    bench_protocol: NotRequired[int]  # BENCH_PROTOCOL (absent: the first edition's)
    task: str  # the task spec
    setting: str  # paper, equal-data, or tune (a trial)
    seed: int
    method: str  # the registry name
    label: str  # the variant's label
    budget: float | None  # FLOPs; None for a method with no training compute (one cell serves every budget)
    kind: str  # the adapter's kind: fixed, population, iterative
    budget_share: NotRequired[float]  # the share of the budget it spent at most (its method's tuning charged to it)
    trial: NotRequired[int]  # a trial's index in its method's search
    tuning: NotRequired[dict]  # a final cell's: the trial it took its options from, and on what it was tuned
    status: str  # done, does not fit, ... (abstained rows say so in their name)
    reason: NotRequired[str]  # why a cell does not fit
    rows: list[CellRow]
    example_ids: NotRequired[list[str] | None]  # the test examples, in the rows' `correct` order
    flops: float  # what the cell was charged: training/selection FLOPs toward its output
    units: int | None  # specialists, iterations or steps it reached
    wall_seconds: float
    hyperparameters: NotRequired[dict]  # the options that define it, beyond the bench's common ones
    run_dir: NotRequired[str]  # where it ran (git-ignored; gone in a later session)
    budget_reached: NotRequired[bool]  # whether a larger prefix or run would have gone over the budget
    detail: NotRequired[dict]  # what the method's report says of its own decisions (CoRP: accepted, reason, gate,
    # candidate_test; any method: edge_flags, a searched value on its grid's edge)
    tried: NotRequired[list]  # every try toward the budget (population methods): size, cost, own evaluations
    population_run: NotRequired[str]  # the shared scored population the prefix came from
    population_sigmas: NotRequired[list]
    population_seconds: NotRequired[float]  # the scoring time of the specialists the cell read
    own_flops: NotRequired[float]  # the method's own evaluations (CoRP's probe, step search, gates)
    own_estimate: NotRequired[float | None]  # what the first try was sized with (None: scoring alone)
    race: NotRequired[dict]  # a raced RandOpt's rounds
    grown: NotRequired[list]  # an iterative cell's growth (units and FLOPs at each start)
    wall_seconds_increment: NotRequired[float]  # an iterative cell's share of its run's time
    retention: NotRequired[Any]  # off-task scores of the cell's final model (bench retention)


class Comparison(TypedDict):
    """Row a against row b at one task, setting and budget, on the seeds both ran (stats.compare_paired_seeds)."""

    a: str
    b: str
    n: int  # paired test outcomes, over all compared seeds
    accuracy_a: float
    accuracy_b: float
    difference: float  # accuracy_a - accuracy_b
    ci95: list[float]  # the across-seed interval (seeds x examples); one seed: the paired bootstrap
    mcnemar_p: float | None  # one seed only
    a_only_correct: int
    b_only_correct: int
    method: str  # how the interval was computed, in words
    df: NotRequired[float]  # the t interval's degrees of freedom (several seeds)
    per_seed: NotRequired[list[dict]]
    signs: NotRequired[dict]  # per-seed differences: how many +, -, 0
    n_seeds: NotRequired[int]
    task: str  # the task's label
    setting: str
    budget: float | None
    seeds: list[int]
    seeds_dropped: NotRequired[dict]  # a planned seed left out, with why
    flops_a: NotRequired[float]  # training/selection FLOPs, mean over the compared seeds
    flops_b: NotRequired[float]
    p: NotRequired[float]  # the interval's own two-sided test, where there is a registration
    primary: NotRequired[bool]  # pre-registered (corp.bench.protocol.mark_primary)
    p_holm: NotRequired[float | None]
    holm_reject: NotRequired[bool]


def _fits(value, hint) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)  # JSON writes 0.0 as 0 only by hand
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if isinstance(hint, type) and typing.is_typeddict(hint):
        return isinstance(value, dict) and not _problems(value, hint)
    return isinstance(value, hint)


def _problems(obj: dict, kind: type) -> list[str]:
    hints = typing.get_type_hints(kind)
    out = [f"missing '{k}'" for k in sorted(kind.__required_keys__ - set(obj))]
    out += [f"unknown field '{k}'" for k in sorted(set(obj) - set(hints))]
    for k, v in obj.items():
        if k in hints:
            hint = hints[k]
            if typing.get_origin(hint) is NotRequired:
                (hint,) = typing.get_args(hint)
            (item,) = typing.get_args(hint) if typing.get_origin(hint) is list else (None,)
            if item is not None and typing.is_typeddict(item) and isinstance(v, list):  # say which element, and why
                for i, x in enumerate(v):
                    inner = _problems(x, item) if isinstance(x, dict) else [f"not a mapping: {x!r:.40}"]
                    out += [f"{k}[{i}]: {q}" for q in inner]
            elif not _fits(v, hint):
                out.append(f"'{k}' is {type(v).__name__} {v!r:.60}, not {hint}")
    return out


def check_record(obj: dict, kind: type = CellRecord, where: str = "a cell record") -> None:
    """Raise CorpError naming the first field of `obj` that is not what `kind` says."""
    problems = _problems(obj, kind)
    if problems:
        raise CorpError(
            f"{where} does not match corp.bench.records.{kind.__name__}: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + "; a new field needs its line there"
        )
