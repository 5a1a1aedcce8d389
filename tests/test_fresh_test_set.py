"""The third edition's test set is fresh (issue 39): no committed result under results/ (any edition's
cells, rows, populations, make-run, reports) names one of its examples, and its development pool
is disjoint from it.

Committed files name examples by id (cell records' `example_ids`, splits.json, population rows,
test_outcomes.json, lm-eval-compare's examples.jsonl, ...); every text file under results/ is
scanned for anything shaped like an id (`NAME-123`), so a new kind of file is covered without
knowing its layout. The questions themselves are checked too, against every committed file and
against the task's own selection pool.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from corp.evaluate.tasks import SplitSizes, dev_pool, get_task, make_splits

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "bench-cpu-3.yaml"
ID = re.compile(r"(?<![\w-])[a-z][a-z0-9_]*(?:-[a-z][a-z0-9_]*)*-\d+(?![\w-])")


@cache
def committed() -> tuple[frozenset[str], str]:
    """(every id-shaped string in a committed text file under results/, all that text joined)."""
    ids: set[str] = set()
    texts = []
    for path in sorted((REPO / "results").rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:  # images and other binary files name no examples
            continue
        text = data.decode("utf-8", errors="replace")
        ids.update(ID.findall(text))
        texts.append(text)
    return frozenset(ids), "\n".join(texts)


def touched(ids) -> list[str]:
    found, _ = committed()
    return sorted(set(ids) & found)


def question(prompt: str) -> str:
    return prompt.split("\n")[0].strip()


@cache
def third_edition() -> dict:
    cfg = yaml.safe_load(CONFIG.read_text())
    out = {}
    for entry in cfg["tasks"]:
        spec = entry["task"] if isinstance(entry, dict) else entry
        task = get_task(spec)
        sizes = SplitSizes(cfg["n_support"], cfg["n_probe"], cfg["n_validation"], cfg["n_test"])
        out[spec] = (task, make_splits(task, sizes, cfg["split_seed"]), dev_pool(task, spec), cfg)
    return out


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
    assert touched(e.id for e in held_out) == []
    _, text = committed()
    assert [e.id for e in held_out if question(e.prompt) in text] == []
    # test, development and selection never share an example, by id or by question
    selection = splits["support"] + splits["probe"] + splits["validation"]
    assert {e.id for e in test}.isdisjoint(e.id for e in dev)
    assert {e.id for e in test}.isdisjoint(e.id for e in task.pools()["train"])
    assert {e.prompt for e in test}.isdisjoint(e.prompt for e in dev + task.pools()["train"])
    assert {e.id for e in dev}.isdisjoint(e.id for e in selection)
