"""Issue 57's bench cases: what a bench config or a results directory gets wrong is one line before
anything is computed or written, and --report-only keeps the outputs' provenance."""

from __future__ import annotations

import pytest

from corp import CorpError
from corp.bench.config import BenchConfig
from corp.config import load_config
from tests.test_bench import tiny_options


def _cfg(tiny_dir, root, **over) -> BenchConfig:
    base = dict(seeds=[1], settings=["paper"], compare=[], methods={"self-consistency": {"options": {"k": [1]}}})
    return load_config(BenchConfig, None, tiny_options(tiny_dir, root, **{**base, **over}))


def test_a_budget_given_twice_is_refused(tiny_dir, tmp_path):
    with pytest.raises(CorpError, match=r"budgets repeat 3e\+08; give each budget once"):
        _cfg(tiny_dir, tmp_path, budgets=[3e8, 3e8])
    with pytest.raises(CorpError, match="budgets repeat"):
        _cfg(tiny_dir, tmp_path, budgets=[1e8, 3e8, 3.0e8])
