"""The third edition's test set is fresh (issue 39): no committed result under results/ (any edition's
cells, rows, populations, make-run, reports) names one of its examples, and its development pool
is disjoint from it. That holds for its tasks (`tasks`, whose cells run) and for its retention tasks
(`retention_tasks`, off-task only: every final model's accuracy on their test examples).

The third edition's own directory (results/bench-cpu-3) is where those examples are meant to
appear as its run goes on, and so is that of every bench registered on the same test set (its
config's `test_set`, with the same task, split seed and sizes: bench-noise-3): their tuning cells name
development examples and never a test example, and only their final cells and split records
(splits.json) may name test examples. Everything else under results/ names neither.

Committed files name examples by id (cell records' `example_ids`, splits.json, population rows,
test_outcomes.json, lm-eval-compare's examples.jsonl, ...); every text file under results/ is
scanned for anything shaped like an id (`NAME-123`), so a new kind of file is covered without
knowing its layout. The questions themselves are checked too, against every committed file and
against the task's own selection pool. The question is what tells two variants of one task apart:
add3 (`arith:digits=3,...`) names its examples arith-N like arith does, and its 600 test examples
have arith's test ids, with other questions.
"""

from __future__ import annotations

import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from corp.evaluate.tasks import SplitSizes, dev_pool, get_task, make_splits

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "bench-cpu-3.yaml"
SPLIT_FIELDS = ("split_seed", "n_support", "n_probe", "n_validation", "n_test")  # with the tasks: the split


def _sharing() -> dict[str, dict]:
    """The configs of the benches on the third edition's test set (its config's `test_set`), by bench name."""
    fresh = yaml.safe_load(CONFIG.read_text())["test_set"]
    cfgs = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "configs").glob("*.yaml"))]
    return {c["name"]: c for c in cfgs if isinstance(c, dict) and c.get("test_set") == fresh}


SHARING = _sharing()
OWN = tuple(REPO / "results" / name for name in SHARING)  # bench-cpu-3's own results, and bench-noise-3's
ID = re.compile(r"(?<![\w-])[a-z][a-z0-9_]*(?:-[a-z][a-z0-9_]*)*-\d+(?![\w-])")


def texts(root: Path, skip: tuple[Path, ...] = ()) -> dict[Path, str]:
    """Every committed text file under root (outside the directories in skip), by path."""
    out = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or any(path.is_relative_to(d) for d in skip):
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:  # images and other binary files name no examples
            continue
        out[path] = data.decode("utf-8", errors="replace")
    return out


@cache
def committed() -> tuple[frozenset[str], str]:
    """(every id-shaped string in a committed text file under results/ outside the directories of the
    benches on the fresh test set, all that text joined)."""
    found = texts(REPO / "results", skip=OWN)
    ids = {i for text in found.values() for i in ID.findall(text)}
    return frozenset(ids), "\n".join(found.values())


def touched(ids) -> list[str]:
    found, _ = committed()
    return sorted(set(ids) & found)


def question(prompt: str) -> str:
    return prompt.split("\n")[0].strip()


@cache
def third_edition() -> dict:
    """Per task spec (the config's tasks, then its retention tasks): (task, splits, development pool, config)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    out = {}
    for entry in cfg["tasks"] + retention_tasks():
        spec = entry["task"] if isinstance(entry, dict) else entry
        task = get_task(spec)
        sizes = SplitSizes(cfg["n_support"], cfg["n_probe"], cfg["n_validation"], cfg["n_test"])
        out[spec] = (task, make_splits(task, sizes, cfg["split_seed"]), dev_pool(task, spec), cfg)
    return out


def test_every_bench_on_the_fresh_test_set_uses_its_split():
    """A bench may name the fresh test examples only if it draws exactly the third edition's split (the
    same test_set name on another split would name other examples, unchecked)."""
    third = yaml.safe_load(CONFIG.read_text())
    assert {"bench-cpu-3", "bench-noise-3"} <= set(SHARING), list(SHARING)
    for name, cfg in SHARING.items():
        assert [t["task"] for t in cfg["tasks"]] == [t["task"] for t in third["tasks"]], name
        for field in SPLIT_FIELDS:
            assert cfg.get(field) == third.get(field), (name, field)


@cache
def retention_tasks() -> list[str]:
    """The retention tasks' specs: no cells, no trials; their test examples are scored on each final model."""
    return list(yaml.safe_load(CONFIG.read_text()).get("retention_tasks") or [])


def test_the_scan_finds_what_earlier_editions_used():
    # not vacuous: the second edition's 300 arith test examples (split seed 0, the first of the first
    # edition's 500) and letters' are all found, and so would be flagged in a "fresh" set
    old = make_splits(get_task("arith"), SplitSizes(16, 64, 64, 300), 0)["test"]
    assert touched(e.id for e in old) == sorted(e.id for e in old)
    letters = get_task("rg:letter_counting:min_words=1,max_words=3,size=2000,instruction=none,extract=fallback")
    old = make_splits(letters, SplitSizes(16, 64, 64, 300), 0)["test"]
    assert len(touched(e.id for e in old)) == 300
    assert "arith-3428" in committed()[0] and "What is 70 + 35?" in committed()[1]


@pytest.mark.parametrize("spec", list(third_edition()))
def test_fresh_test_and_dev_are_untouched_and_disjoint(spec):
    task, splits, dev, cfg = third_edition()[spec]
    test = splits["test"]
    assert len(test) == cfg["n_test"] >= 600
    held_out = task.pools()["test"] + dev
    # no committed result names a held-out example (test pool and development pool), by id or by question
    assert touched(e.id for e in held_out) == [], "a committed result names a held-out example by id"
    _, text = committed()
    assert [e.id for e in held_out if question(e.prompt) in text] == [], (
        "a committed result names a held-out example by question"
    )
    # test, development and selection never share an example, by id or by question
    selection = splits["support"] + splits["probe"] + splits["validation"]
    assert {e.id for e in test}.isdisjoint(e.id for e in dev)
    assert {e.id for e in test}.isdisjoint(e.id for e in task.pools()["train"])
    assert {e.prompt for e in test}.isdisjoint(e.prompt for e in dev + task.pools()["train"])
    assert {e.id for e in dev}.isdisjoint(e.id for e in selection)


def kind_of(path: Path, text: str) -> str:
    """'tune' (a trial's cell, on development examples), 'final' (a final cell, on the test set),
    'splits' (a run's split record) or 'other'. A cell's `setting` says which (its `kind` is the
    method's adapter kind: fixed, population, iterative)."""
    if path.name == "splits.json":
        return "splits"
    if path.parent.name == "cells" and path.suffix == ".json":
        return "tune" if json.loads(text)["setting"] == "tune" else "final"
    return "other"


@pytest.mark.parametrize("spec", list(third_edition()))
def test_the_third_edition_tunes_on_development_examples_only(spec):
    task, splits, dev, cfg = third_edition()[spec]
    test = {e.id for e in task.pools()["test"]}
    dev_ids = {e.id for e in dev}
    kinds = {}
    for path, text in (item for own in OWN for item in texts(own).items()):
        ids = set(ID.findall(text))
        kind = kind_of(path, text)
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind != "final" and kind != "splits":
            # a tuning cell, a population's rows, a report: never a test example
            assert not ids & test, f"{path.relative_to(REPO)} names test examples"
            assert [e.id for e in splits["test"] if question(e.prompt) in text] == [], path
        if kind == "tune" and spec not in retention_tasks():
            # and a tuning cell's examples are development examples of this task (a retention task has
            # no trials, and add3's ids are arith's: its development ids are no evidence either way)
            named = {i for i in ids if i.split("-")[0] == next(iter(test)).split("-")[0]}
            assert named and named <= dev_ids, f"{path.relative_to(REPO)} tunes outside the development pool"
    if not kinds:
        pytest.skip("the third edition has committed nothing yet")


def test_the_own_directory_check_can_fail(tmp_path, monkeypatch):
    # plant a tuning cell that names a test example: the check above must flag it
    task, splits, dev, cfg = next(iter(third_edition().values()))
    cells = tmp_path / "cells"
    cells.mkdir()
    cell = {"setting": "tune", "kind": "population", "example_ids": [dev[0].id, splits["test"][0].id]}
    (cells / "planted.json").write_text(json.dumps(cell))
    monkeypatch.setattr(sys.modules[__name__], "OWN", (tmp_path,))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError, match="names test examples"):
        test_the_third_edition_tunes_on_development_examples_only(next(iter(third_edition())))
    cell["example_ids"] = [task.pools()["train"][0].id]
    (cells / "planted.json").write_text(json.dumps(cell))
    with pytest.raises(AssertionError, match="outside the development pool"):
        test_the_third_edition_tunes_on_development_examples_only(next(iter(third_edition())))
    # a final cell is scored on the test set: it names test examples, and that is not flagged (a cell's
    # `kind` is its adapter's, fixed here, and was once read as tune/final: the first final cell failed)
    final = {"setting": "equal-data", "kind": "fixed", "example_ids": [e.id for e in splits["test"][:3]]}
    (cells / "planted.json").write_text(json.dumps(final))
    test_the_third_edition_tunes_on_development_examples_only(next(iter(third_edition())))


def test_the_retention_tasks_are_checked_and_the_check_can_fail(tmp_path, monkeypatch):
    # add3 is checked like arith; a committed result that names one of its test examples is flagged, by
    # id and by its question alone, and arith's example of the same id is not taken for add3's
    assert retention_tasks() and set(retention_tasks()) <= set(third_edition())
    arith, add3 = next(iter(third_edition())), retention_tasks()[0]
    example = third_edition()[add3][1]["test"][0]
    twin = next(e for e in third_edition()[arith][1]["test"] if e.id == example.id)
    assert question(twin.prompt) != question(example.prompt)  # same id, another question
    planted = tmp_path / "results" / "planted" / "rows.jsonl"
    planted.parent.mkdir(parents=True)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "OWN", (tmp_path / "results" / "bench-cpu-3",))
    committed.cache_clear()
    try:
        for row, flagged in (
            ({"id": example.id, "prompt": example.prompt}, "by id"),
            ({"prompt": example.prompt}, "by question"),
        ):
            planted.write_text(json.dumps(row) + "\n")
            committed.cache_clear()
            with pytest.raises(AssertionError, match=flagged):
                test_fresh_test_and_dev_are_untouched_and_disjoint(add3)
        # arith's example of the same id, by its question: arith's check flags it, add3's does not
        planted.write_text(json.dumps({"prompt": twin.prompt}) + "\n")
        committed.cache_clear()
        test_fresh_test_and_dev_are_untouched_and_disjoint(add3)
        with pytest.raises(AssertionError, match="by question"):
            test_fresh_test_and_dev_are_untouched_and_disjoint(arith)
    finally:
        committed.cache_clear()  # the other tests read the real results/
