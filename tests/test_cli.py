"""Through the real `corp` CLI: bad input gives one line (our checks and the parser's), renamed flags
warn in one line, and RandOpt / CoRP end to end on the embedded model."""

import json
import os
import re
import subprocess
import sys
import warnings

import pytest

from tests.conftest import DATA_DIR


def slow(*values):
    """A parametrization that runs only in the full suite: each case starts a `corp` process (a few seconds
    of imports); the fast suite keeps one case of each kind (our check, the parser's, the population source)."""
    return pytest.param(*values, marks=pytest.mark.slow)


def corp(*args, cwd=None, timeout=600):
    env = {**os.environ, "CORP_NO_PROGRESS": "1", "CORP_DATA_DIR": str(DATA_DIR)}
    return subprocess.run(
        [sys.executable, "-m", "corp.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["randopt", "--task", "nope"], "unknown task 'nope'"),
        slow(["randopt", "--sigmas", "0,1e-3"], "--sigmas must all be > 0"),
        slow(["randopt", "--population", "0"], "--population must be >= 1"),
        slow(["randopt", "--population", "4", "--top-k", "1,8"], "K must be <= N"),
        slow(
            ["randopt", "--model", "no-such/model-xyz", "--population", "2", "--top-k", "1"],
            "model 'no-such/model-xyz' not found",
        ),
        slow(["randopt", "--task", "jsonl:/nonexistent.jsonl"], "'/nonexistent.jsonl' does not exist"),
        slow(
            ["randopt", "--n-test", "0", "--population", "2", "--top-k", "1", "--model", "no-such/model-xyz"],
            "test split is empty",
        ),
        slow(["randopt", "--output-dir", "/proc/corp-cannot-write"], "not writable"),
        # the parser's own errors: one line too, no usage box
        (["randopt", "--no-such-flag", "1"], "Unrecognized options: --no-such-flag"),
        slow(["randopt", "--population", "many"], "Error parsing --population"),
        slow(["frobnicate"], "No such command 'frobnicate'"),
        # the population source: --from-run; the old flag still works, but not both
        (["randopt", "--from-run", "/nonexistent-run"], "--from-run '/nonexistent-run' has no population.jsonl"),
        slow(
            ["consolidate", "--population-from", "/a", "--from-run", "/b"],
            "--population-from is the old name of --from-run; give only --from-run",
        ),
    ],
)
def test_bad_input_is_one_line_error(args, message, tmp_path):
    res = (
        corp(*args, "--n-support", "4", cwd=tmp_path)
        if "--n-test" not in args and args[0] != "frobnicate"
        else corp(*args, cwd=tmp_path)
    )
    assert res.returncode == 2, res.stderr
    err_lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(err_lines) == 1 and message in err_lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args, warning, message",
    [
        (
            ["analyze-rank", "--run", "/nonexistent-run"],
            "--run is deprecated; use --from-run",
            "--from-run '/nonexistent-run' has no population.jsonl",
        ),
        slow(
            ["randopt", "--population-from", "/nonexistent-run"],
            "--population-from is deprecated; use --from-run",
            "--from-run '/nonexistent-run'",
        ),
        slow(
            ["analyze-rank", "--alpha", "0.01"],
            "--alpha is deprecated; use --significance",
            "--significance 0.01, so nothing could pass",
        ),
        # issue 40's names (docs/commands.md, "Names"): the old flag still works, with one line
        (["grpo", "--steps", "0"], "--steps is deprecated; use --max-steps", "--max-steps must be >= 1"),
        slow(["grpo", "--checkpoint-every", "0"], "--checkpoint-every is deprecated; use --save-steps", "--save-steps"),
        slow(["fgrpo", "--steps", "0"], "--steps is deprecated; use --local-steps", "--local-steps must be >= 1"),
        slow(["es", "--alpha", "inf"], "--alpha is deprecated; use --learning-rate", "--learning-rate must be > 0"),
        slow(["es", "--population", "3", "--antithetic"], "use --population-per-iteration", "must be even"),
        slow(["consolidate", "--rounds", "-1"], "--rounds is deprecated; use --stage2-rounds", "--stage2-rounds >= 0"),
        slow(["self-consistency", "--k", "0"], "--k is deprecated; use --vote-k", "--vote-k values must be >= 1"),
        slow(["eval", "--n-samples", "1", "--pass-k", "4"], "use --num-generations", "--num-generations 1 is smaller"),
        slow(["fera", "--samples", "0"], "--samples is deprecated; use --num-generations", "--num-generations must be"),
        slow(["score", "--max-new-tokens", "0"], "use --max-completion-length", "--max-completion-length must be >= 1"),
    ],
)
def test_renamed_flag_warns_in_one_line(args, warning, message, tmp_path):
    res = corp(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    warned = [ln for ln in lines if ln.startswith("warning:")]
    assert len(warned) == 1 and warning in warned[0] and "one release" in warned[0], res.stderr
    err = [ln for ln in lines if ln.startswith("error:")]
    assert len(err) == 1 and message in err[0], res.stderr


def test_help_lists_every_registered_method(tmp_path):
    from corp.methods import METHODS

    res = corp("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for m in METHODS:
        assert m.name in res.stdout
    assert "--population-from" not in corp("randopt", "--help", cwd=tmp_path).stdout  # deprecated flags are hidden


def _help_entries(text: str) -> dict[str, str]:
    """{option: its help entry without whitespace (a long word may be wrapped anywhere)} from a rendered
    `--help` (plain, or rich's boxes)."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.replace("\u2502", " ").splitlines():
        m = re.match(r"^ {1,4}(--[a-z][\w-]*)", line)
        if m:
            current = m.group(1)
            entries[current] = []
        if current is not None:
            entries[current].append(line)
    return {k: "".join("".join(v).split()) for k, v in entries.items()}


def test_help_shows_every_default():
    """Every command's `--help` shows the default of every option that has one (rich markup used to
    read `[default: 64]` as a tag and drop it)."""
    import dataclasses

    from typer.main import get_command
    from typer.testing import CliRunner

    from corp.cli import app
    from corp.config import flag, option_names
    from corp.methods import REGISTRY

    commands = get_command(app).commands
    for name, command in commands.items():
        expected, shown_as = {}, "[default:{}]"  # click's way (typer's commands)
        if name in REGISTRY:  # options generated from the config by tyro: the field defaults, tyro's way
            shown_as = "(default:{})"
            cls = REGISTRY[name].config
            for f in dataclasses.fields(cls):
                if f.name not in option_names(cls):
                    continue
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                shown = ",".join(map(str, default)) if isinstance(default, list) else default
                if shown not in (None, ""):
                    expected[flag(f.name, REGISTRY[name].config)] = str(shown)
        else:  # an option by click's own word for it: typer's options are its vendored click's, not click.Option
            for p in command.params:
                if p.param_type_name == "option" and not p.required and p.default not in (None, False, ""):
                    expected[p.opts[0]] = str(p.default)
        res = CliRunner().invoke(app, [name, "--help"])
        assert res.exit_code == 0, res.output
        entries = _help_entries(res.output)
        for option, shown in expected.items():
            assert shown_as.format("".join(shown.split())) in entries.get(option, ""), (
                name,
                option,
                entries.get(option),
            )
    assert len(commands) > 10 and "sigmas[i%len(sigmas)]" in _help_entries(
        CliRunner().invoke(app, ["randopt", "--help"]).output
    ).get("--sigmas", "")


def test_every_config_field_is_an_option_generated_from_the_config(monkeypatch, tmp_path):
    """Each command's options are its config's fields (corp.cli.flags_of, parsed by tyro), none written out by
    hand: every registered method's `--help` has a flag per option field, helped by the field's docstring, and
    no old flag. A field planted in a config becomes a flag, with its docstring, its default and its comma list
    (one word, read by corp.config's parser), without a line of CLI code; its old name works with one warning
    line; every usage error is one `error:` line. A field of a type no flag can give is refused when the
    command is made."""
    import dataclasses
    from typing import ClassVar

    import tyro
    from typer.testing import CliRunner

    import corp.cli as cli
    from corp.config import RandOptConfig, field_docs, flag, option_names, renamed_options
    from corp.methods import REGISTRY

    for name, method in REGISTRY.items():
        entries = _help_entries(CliRunner().invoke(cli.app, [name, "--help"]).output)
        names, docs = option_names(method.config), field_docs(method.config)
        for field_name, option in names.items():
            shown = entries.get(flag(option), "")
            assert "".join(docs[field_name].split()) in shown, (name, option, shown)
        assert set(entries) == {flag(o) for o in names.values()} | {"--config"}, name
        parsed = {f.name for f in dataclasses.fields(cli.flags_of(method.config))}  # the old flags: parsed, hidden
        assert parsed == set(names.values()) | set(renamed_options(method.config)) | {"config"}, name

    @dataclasses.dataclass
    class Planted(RandOptConfig):
        planted_knob: list[int] = dataclasses.field(default_factory=lambda: [2, 3])
        """A planted knob, comma-separated."""
        planted_flag: bool = False
        """A planted switch."""

        renamed: ClassVar[dict[str, str]] = {"old_knob": "planted_knob"}

        def validate(self):  # this test runs nothing: the parsed values are what it checks
            return self

    got = []
    monkeypatch.setattr(cli.app, "registered_commands", list(cli.app.registered_commands))
    cli.config_command("planted", Planted, "A planted command.")(got.append)
    helped = _help_entries(CliRunner().invoke(cli.app, ["planted", "--help"]).output)
    assert helped["--planted-knob"] == "--planted-knobINT,...Aplantedknob,comma-separated.(default:2,3)", helped
    assert helped["--planted-flag"] == "--planted-flagAplantedswitch.(default:False)" and "--old-knob" not in helped
    res = CliRunner().invoke(cli.app, ["planted", "--planted-knob", "5,8", "--planted-flag", "--top-k", "1,2"])
    assert res.exit_code == 0, res.output
    assert got[0].planted_knob == [5, 8] and got[0].planted_flag is True and got[0].top_k == [1, 2]
    assert got[0].sigmas == "auto" and got[0].population == 64  # what was not given: the defaults
    with warnings.catch_warnings():  # as the `corp` script shows it (pytest's configuration hides FutureWarning)
        warnings.simplefilter("default")
        old = CliRunner().invoke(cli.app, ["planted", "--old-knob", "7"])
    assert old.exit_code == 0 and got[1].planted_knob == [7] and got[1].planted_flag is False, old.output
    assert old.stderr.splitlines() == [
        "warning: --old-knob is deprecated; use --planted-knob (the old name is kept for one release)"
    ]
    yaml_file = tmp_path / "planted.yaml"
    yaml_file.write_text("planted_knob: 9,10\npopulation: 5\nplanted_flag: true\n")
    res = CliRunner().invoke(cli.app, ["planted", "--config", str(yaml_file), "--population", "7"])
    assert res.exit_code == 0, res.output  # defaults <- YAML <- only the flags given (a switch not given: YAML's)
    assert got[2].planted_knob == [9, 10] and got[2].population == 7 and got[2].planted_flag is True
    for bad, said, boxes in [
        (["--planted-knob"], "--planted-knob", True),  # no value
        (["--planted-knob", "5,x"], "--planted-knob is '5,x'", True),  # not a list of integers: corp.config's line
        (["--population", "many"], "--population", True),  # not an integer: tyro's
        (["--population", "many"], "--population", False),  # tyro's error without box characters
        (["--no-such-knob", "1"], "--no-such-knob", True),
    ]:
        monkeypatch.setitem(tyro._experimental_options, "utf8_boxes", boxes)
        res = CliRunner().invoke(cli.app, ["planted", *bad])
        lines = res.stderr.splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (bad, res.stderr)
        assert said in lines[0] and "Traceback" not in res.output, (bad, lines)
    assert len(got) == 3

    @dataclasses.dataclass
    class Unflaggable(RandOptConfig):
        planted_map: dict = dataclasses.field(default_factory=dict)
        """A mapping: no flag gives one."""

    with pytest.raises(TypeError, match="'planted_map' is a <class 'dict'>, which has no flag form"):
        cli.config_command("unflaggable", Unflaggable, "Never made.")(got.append)


def test_help_shows_each_commands_summary_whole_and_version_is_the_packages():
    """`corp --help` gives each command its whole summary, wrapped (click cut every one short at the
    terminal's width with '...'); `corp --version` prints the installed package's version."""
    import importlib.metadata

    from typer.main import get_command
    from typer.testing import CliRunner

    from corp.cli import app

    res = CliRunner().invoke(app, ["--help"], terminal_width=80)
    assert res.exit_code == 0 and "..." not in res.output.partition("Commands:")[2], res.output
    flat = "".join(res.output.split())
    for name, command in get_command(app).commands.items():
        summary = (command.help or "").split("\n\n")[0]
        assert f"{name}{''.join(summary.split())}" in flat, name
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output == f"corp {importlib.metadata.version('corp')}\n"


def test_bare_corp_prints_the_help_and_exits_0():
    """`corp` alone: the same text as `corp --help`, status 0 (not a usage error, not an empty line)."""
    from typer.testing import CliRunner

    from corp.cli import app

    bare, helped = CliRunner().invoke(app, []), CliRunner().invoke(app, ["--help"])
    assert bare.exit_code == helped.exit_code == 0, bare.output
    assert bare.output == helped.output and "consolidate" in bare.output


@pytest.mark.slow
@pytest.mark.embedded
def test_randopt_end_to_end_on_embedded_model(tmp_path):
    run = tmp_path / "run"
    res = corp(
        "randopt",
        "--population",
        "3",
        "--n-support",
        "8",
        "--n-test",
        "8",
        "--top-k",
        "1,3",
        "--sigmas",  # pinned: the consolidate test below runs the default calibration end to end
        "1e-3,2e-3",
        "--output-dir",
        str(run),
        "--threads",
        "2",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("base", "randopt-top1", "randopt-vote@3", "FLOPs ="):
        assert name in res.stdout
    report = json.loads((run / "report.json").read_text())
    rows = {r["method"]: r for r in report["test"]}
    assert rows["randopt-vote@3"]["passes_per_example"] == 3
    assert rows["base"]["generated_tokens"] > 0 and rows["base"]["flops"] > 0
    assert report["population"]["n"] == 3
    pop = [json.loads(line) for line in (run / "population.jsonl").read_text().splitlines()]
    assert len(pop) == 3 and all(len(r["correct"]) == 8 for r in pop)
    # rerun on the same directory: nothing is rescored, same report
    res2 = corp(
        "randopt",
        "--population",
        "3",
        "--n-support",
        "8",
        "--n-test",
        "8",
        "--top-k",
        "1,3",
        "--sigmas",
        "1e-3,2e-3",
        "--output-dir",
        str(run),
        cwd=tmp_path,
    )
    assert res2.returncode == 0, res2.stderr[-3000:]
    assert json.loads((run / "report.json").read_text())["test"] == report["test"]


@pytest.mark.slow
@pytest.mark.embedded
def test_consolidate_end_to_end_on_embedded_model(tmp_path):
    run = tmp_path / "run"
    res = corp(
        "consolidate",
        "--population",
        "4",
        "--n-support",
        "8",
        "--n-probe",
        "8",
        "--n-validation",
        "8",
        "--n-test",
        "8",
        "--alphas",
        "1,4",
        "--top-k",
        "1,2",
        "--output-dir",
        str(run),
        "--threads",
        "2",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "gate (validation, n=8)" in res.stdout and "randopt-vote@2" in res.stdout
    report = json.loads((run / "report.json").read_text())
    corp_row = report["test"][-1]
    assert corp_row["method"].startswith("corp") and corp_row["passes_per_example"] == 1
    assert set(report["corp"]["gate_validation"]) >= {"accepted", "n", "mean_diff", "sd_diff", "lcb"}
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["base_model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (run / "model" / "model.safetensors").exists() and (run / "model" / "tokenizer.json").exists()
    assert "too small for the gate" in res.stderr, "small validation split must warn"
