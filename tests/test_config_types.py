"""Config values are checked against their dataclass field types in one place (`corp.config.check_types`),
for flags and YAML alike, every registered method and the bench config: one line naming the field,
the value and the expected type."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from typer.testing import CliRunner

from corp.bench.config import BenchConfig
from corp.cli import app
from corp.config import flag, load_config, option_names
from corp.errors import CorpError
from corp.methods import methods


def _takes(tp, value) -> bool:
    """Whether a field of type `tp` takes `value` by the documented rules (corp.config, "Types"), written out
    here apart from the code under test: how a union's wrong values are told from its other members' right ones."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        if isinstance(value, str):  # a comma-separated string of T
            return all(_parses(args[0], v) for v in value.split(","))
        items = value if isinstance(value, list) else [value]
        return not isinstance(value, dict) and all(_takes(args[0], v) for v in items)
    if tp is int:
        return type(value) is int
    if tp is float:
        try:
            return not isinstance(value, bool) and isinstance(float(value), float)
        except (TypeError, ValueError):
            return False
    return isinstance(value, tp)


def _parses(tp, text: str) -> bool:
    """Whether one item of a comma-separated list option reads as a `tp`."""
    try:
        tp(text.strip())
    except ValueError:
        return False
    return True


def _wrong_values(tp) -> list:
    """Values of the wrong type for a field of type `tp` (of a union: wrong for each of its members)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _wrong_values(members[0])
        wrong = [v for m in members for v in _wrong_values(m) if not any(_takes(o, v) for o in members)]
        return [v for i, v in enumerate(wrong) if not any(type(v) is type(w) and v == w for w in wrong[:i])]
    if origin is list:
        elem = {int: 1.5, float: "abc", str: 5}.get(args[0], 5)  # 5: neither of list[str | dict]'s item types
        return [{"a": 1}, [elem]]
    if tp is dict:
        return [[1], "x"]
    if tp is list:
        return [{"a": 1}]
    return {
        int: ["7", True, 2.5, None if False else "abc"],
        float: ["abc", True, [1.0]],
        str: [5, 1.5, True],
        bool: ["yes", 1],
    }[tp]


def _cases():
    classes = {m.config for m in methods()} | {BenchConfig}
    for cls in sorted(classes, key=lambda c: c.__name__):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in option_names(cls):  # not an option of the command (its `not_options`)
                continue
            for value in _wrong_values(hints[f.name]):
                yield pytest.param(cls, f.name, value, id=f"{cls.__name__}.{f.name}={value!r}")


@pytest.mark.parametrize("cls, name, value", list(_cases()))
def test_every_field_of_every_config_refuses_a_wrong_type(cls, name, value):
    with pytest.raises(CorpError) as err:
        load_config(cls, None, {name: value})
    msg = str(err.value)
    assert "\n" not in msg and flag(name, cls) in msg and "expected" in msg and repr(value)[:20] in msg, msg


def test_every_registered_config_field_has_a_type_the_checker_knows():
    known = {int, float, str, bool, dict, list}
    for cls in {m.config for m in methods()} | {BenchConfig}:
        for name, tp in typing.get_type_hints(cls).items():
            if typing.get_origin(tp) is typing.ClassVar:  # class settings (renamed, local_only), not options
                continue
            for b in _bare(tp):
                assert b in known, f"{cls.__name__}.{name}: {tp}"


def _bare(tp) -> set:
    """The plain types in `tp`: unions unwrapped, a list and its item type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_bare(a) for a in args if a is not type(None)))
    if origin is list:
        return {list}.union(*(_bare(a) for a in args))
    return {origin or tp}


def test_yaml_values_are_checked_and_named_by_file(tmp_path):
    from corp.config import RandOptConfig

    for text, fragment in (
        ("population: '32'\n", "key 'population' is '32' (str); expected an integer"),
        ("population: 2.5\n", "expected an integer"),
        ("population: true\n", "(bool)"),
        ("n_test: '4'\n", "key 'n_test'"),
        ("seed: abc\n", "key 'seed'"),
        ("threads: two\n", "key 'threads'"),
        ("task: 5\n", "expected a string"),
        ("top_k: abc\n", "key 'top_k' is 'abc' (str); expected a list of integers"),
        ("population: 4\npopulation: 8\n", "'population' is given twice"),
    ):
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(CorpError, match="c.yaml") as err:
            load_config(RandOptConfig, str(tmp_path / "c.yaml"))
        assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
    # numbers YAML 1.1 reads as strings still work where a number is meant
    (tmp_path / "c.yaml").write_text("sigmas: [1e-3, 2e-3]\npopulation: 4\ntop_k: 2\n")
    cfg = load_config(RandOptConfig, str(tmp_path / "c.yaml"))
    assert cfg.sigmas == [1e-3, 2e-3] and cfg.top_k == [2]


def test_bench_config_values_are_checked(tmp_path):
    (tmp_path / "b.yaml").write_text("population: '32'\nmethods: {randopt: {}}\n")
    with pytest.raises(CorpError, match="key 'population' is '32'"):
        load_config(BenchConfig, str(tmp_path / "b.yaml"))


@pytest.mark.parametrize("case", ["directory", "binary", "duplicate"])
def test_bad_config_files_are_one_line_through_the_cli(tmp_path, case):
    path = tmp_path / "c.yaml"
    if case == "directory":
        path.mkdir()
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00population: 2\n")
    else:
        path.write_text("n_test: 4\nn_test: -1\n")  # without the check: the last value, refused by validate, fast
    for args in (["randopt", "--config", str(path)], ["bench", "--config", str(path)]):
        res = CliRunner().invoke(app, args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --config"), res.output
        assert {"directory": "is a directory", "binary": "not a UTF-8", "duplicate": "given twice"}[case] in lines[0]


def test_bench_method_options_are_type_checked_before_they_are_clipped(tmp_path, tiny_dir):
    (tmp_path / "b.yaml").write_text(
        f"methods: {{randopt: {{options: {{top_k: abc}}}}}}\ntasks: arith\nseeds: 0\nbudgets: 1e9\nmodel: {tiny_dir}\n"
        f"n_test: 2\nn_support: 2\nn_probe: 0\nn_validation: 0\npopulation: 2\nsettings: paper\n"
        f"work_dir: {tmp_path / 'w'}\nresults_dir: {tmp_path / 'r'}\n"
    )
    res = CliRunner().invoke(app, ["bench", "--config", str(tmp_path / "b.yaml")])
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and "Traceback" not in res.output and len(lines) == 1, res.output
    assert "--top-k is 'abc' (str); expected a list of integers" in lines[0]


@pytest.mark.parametrize("command", ["randopt", "consolidate"])
def test_default_top_k_adapts_to_a_small_population_and_an_explicit_one_does_not(command):
    """--top-k's default (1,4,16) is clipped to --population with one warning line; a K the user gave
    above --population is still the error naming both options."""
    import warnings

    from corp.methods import REGISTRY

    cls = REGISTRY[command].config
    for population, fitted in ((4, [1, 4]), (8, [1, 4, 8]), (16, [1, 4, 16])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = load_config(cls, None, {"population": population})
        assert cfg.top_k == fitted
        notes = [str(w.message) for w in caught]
        assert len(notes) == (population < 16) and all(
            "--top-k" in n and f"--population {population}" in n for n in notes
        )
    with pytest.raises(
        CorpError, match=r"--top-k 16 is larger than --population 4.*lower --top-k or raise --population"
    ):
        load_config(cls, None, {"population": 4, "top_k": "1,16"})


@pytest.mark.parametrize(
    "method, option",
    [
        ("es", "sigma"),
        ("es", "alpha"),
        ("grpo", "temperature"),
        ("grpo", "learning_rate"),
        ("self-consistency", "temperature"),
        ("fgrpo", "tau"),
        ("fera", "sample_temperature"),
    ],
)
def test_an_infinite_scale_is_one_line_naming_the_option(method, option):
    """`--sigma inf` ran ES to the end with sigma saved as null and a recipe of nothing (found by
    benchmarks/probe_reliability.py); every positive scale must also be finite."""
    from corp.errors import CorpError
    from corp.methods import get_method

    m = get_method(method)
    with pytest.raises(CorpError, match=flag(option, m.config)):
        load_config(m.config, None, {option: "inf"})
