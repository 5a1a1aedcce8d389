"""One name, one meaning (issue 40; docs/commands.md, "Names"): option names (TRL's where TRL has the
concept) over unchanged field names, old names accepted with one warning, one default population,
and the stored names (config.yaml, metadata, cache and bench keys) unchanged."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import pytest

from corp.config import PopulationConfig, load_config, option_names, renamed_options, to_fields
from corp.errors import CorpError
from corp.methods import METHODS, REGISTRY

REPO = Path(__file__).resolve().parents[1]


def _names_table() -> list[tuple[str, list[str], list[str]]]:
    """(option, [old names], [commands]) rows of docs/commands.md's Names table."""
    text = (REPO / "docs" / "commands.md").read_text()
    section = text.split("## Names: one name, one meaning", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`--"):
            olds = re.findall(r"`(--[a-z0-9-]+)`", cells[1])
            commands = [c.strip() for c in re.sub(r"\(.*?\)", "", cells[2]).split(",")]
            rows.append((cells[0].strip("`"), olds, commands))
    return rows


def test_every_option_name_is_unique_and_old_names_are_no_current_option():
    for m in METHODS:
        names = option_names(m.config)
        assert len(set(names.values())) == len(names), m.name
        assert not set(renamed_options(m.config)) & set(names.values()), m.name


def test_the_docs_table_names_every_rename_of_every_command():
    table = _names_table()
    assert len(table) >= 14, table
    documented = set()
    for option, olds, commands in table:
        targets = [REGISTRY[c] for c in commands if c in REGISTRY] or [
            m for m in METHODS if option.removeprefix("--").replace("-", "_") in option_names(m.config).values()
        ]
        for m in targets:
            names, renamed = option_names(m.config), renamed_options(m.config)
            field = next(f for f, o in names.items() if "--" + o.replace("_", "-") == option)
            for old in olds:
                key = old.removeprefix("--").replace("-", "_")
                if key in renamed and renamed[key] == field:
                    documented.add((m.name, key))
    for m in METHODS:  # every old name a command accepts is in the table
        for old in renamed_options(m.config):
            assert (m.name, old) in documented, (m.name, old)


def test_old_names_map_to_the_same_field_with_one_warning_and_new_ones_silently():
    from corp.algorithms.grpo import GRPOConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = to_fields(GRPOConfig, {"max_steps": 3, "save_steps": 2, "output_dir": "x"})
    assert new == {"steps": 3, "checkpoint_every": 2, "run_dir": "x"} and not caught
    with pytest.warns(FutureWarning, match="--steps is deprecated; use --max-steps") as caught:
        old = to_fields(GRPOConfig, {"steps": 3})
    assert old == {"steps": 3} and len(caught) == 1 and "one release" in str(caught[0].message)
    with pytest.raises(CorpError, match="--steps is the old name of --max-steps"):
        to_fields(GRPOConfig, {"steps": 3, "max_steps": 4})
    # code, the bench and the API give field names: no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert to_fields(GRPOConfig, {"steps": 3}, user=False) == {"steps": 3}
    assert not caught


def test_a_yaml_config_takes_new_and_old_keys(tmp_path):
    from corp.methods.es import ESConfig

    (tmp_path / "new.yaml").write_text("learning_rate: 0.002\npopulation-per-iteration: 6\nmax_completion_length: 8\n")
    (tmp_path / "old.yaml").write_text("alpha: 0.002\npopulation: 6\nmax_new_tokens: 8\n")
    new = load_config(ESConfig, str(tmp_path / "new.yaml"))
    with pytest.warns(FutureWarning, match="key 'alpha' is deprecated; use 'learning_rate'"):
        old = load_config(ESConfig, str(tmp_path / "old.yaml"))
    assert (new.alpha, new.population, new.max_new_tokens) == (old.alpha, old.population, old.max_new_tokens)
    assert (new.alpha, new.population, new.max_new_tokens) == (0.002, 6, 8)


def test_stored_names_are_the_field_names():
    """config.yaml and every key built from a config use field names: a renamed option changes none of them."""
    from corp.algorithms.grpo import GRPOConfig

    cfg = load_config(GRPOConfig, None, {"max_steps": 3, "max_completion_length": 5})
    stored = dataclasses.asdict(cfg)
    assert stored["steps"] == 3 and stored["max_new_tokens"] == 5
    assert not {"max_steps", "max_completion_length", "output_dir", "save_steps"} & set(stored)
    for m in METHODS:  # the stored keys of every command are its fields, whatever the option names
        assert set(dataclasses.asdict(m.config())) == {f.name for f in dataclasses.fields(m.config)}


def test_one_default_population():
    defaults = {m.name: m.config().population for m in METHODS if issubclass(m.config, PopulationConfig)}
    assert set(defaults) >= {"score", "randopt", "consolidate", "analyze-rank", "fedcorp"}
    assert set(defaults.values()) == {64}, defaults
    from corp.methods.es import ESConfig

    assert option_names(ESConfig)["population"] == "population_per_iteration"  # es counts per iteration


def test_a_bench_config_may_use_option_names_and_its_cells_keep_their_keys(tmp_path):
    """bench-smoke.yaml as committed (field names) and with option names: the same cells, the same keys."""
    from corp.bench.sweep import load_bench_config, plan

    text = (REPO / "configs" / "bench-smoke.yaml").read_text()
    renamed = (
        text.replace("{k: [1, 2, 4]", "{vote_k: [1, 2, 4]")
        .replace("corp-stage1: {rounds: 0}", "corp-stage1: {stage2_rounds: 0}")
        .replace(
            "{population: 2, sigma: 1.0e-3, alpha: 5.0e-4",
            "{population_per_iteration: 2, sigma: 1.0e-3, learning_rate: 5.0e-4",
        )
    )
    assert renamed.count("vote_k") == renamed.count("stage2_rounds") == renamed.count("learning_rate: 5.0e-4") == 1
    (tmp_path / "old.yaml").write_text(text)
    (tmp_path / "new.yaml").write_text(renamed)
    cells = [plan(load_bench_config(str(tmp_path / f)))[0] for f in ("old.yaml", "new.yaml")]
    assert [(c.label, c.opts, c.run_key()) for c in cells[0]] == [(c.label, c.opts, c.run_key()) for c in cells[1]]
