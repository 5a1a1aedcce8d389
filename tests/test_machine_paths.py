"""Issue 57: what corp writes and says names nothing of the user's machine it was not given, and a
path the user typed is treated as a path."""

from __future__ import annotations

import json

import pytest

from corp.errors import CorpError
from corp.runtime.models import check_model_reachable, resolve_model


@pytest.mark.parametrize("name", ["/no/such/model-dir", "./no-such-model", "~/no-such-model-57", "a/b/c"])
def test_a_missing_local_model_path_says_the_directory_does_not_exist(name, monkeypatch, tmp_path):
    """A path-like --model that is not there is a directory the user meant: no hub download is suggested."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for check in (resolve_model, check_model_reachable):
        with pytest.raises(CorpError) as exc:
            check(name)
        msg = str(exc.value)
        assert "does not exist" in msg and name in msg and "hf download" not in msg, msg


def test_a_hub_id_still_gets_the_hub_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CorpError, match="hf download no-such-org/model-57"):
        resolve_model("no-such-org/model-57")


def text_checksum(completions, **_):
    """A reward that moves whenever the text moves (a random tiny model never earns an exact answer)."""
    return [(sum(map(ord, c)) % 97) / 96 for c in completions]


ROWS = [{"prompt": f"Problem: what is {i} + {i}? Solution:", "answer": str(2 * i)} for i in range(16)]


@pytest.fixture
def api_run(tiny_dir, tmp_path, monkeypatch):
    """A CoRP run from Python (a list of dicts, a reward function, no run_dir) with corp's cache in a home directory."""
    import corp

    home = tmp_path / "home-of-the-user"
    monkeypatch.setenv("CORP_CACHE", str(home / ".cache" / "corp"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    result = corp.train_corp(
        str(tiny_dir),
        ROWS,
        text_checksum,
        population=2,
        sigmas=[0.05],
        alphas=[1.0],
        top_k=[1],
        gate_z=-10.0,  # forced open: a random update on a random model
        n_support=4,
        n_probe=2,
        n_validation=2,
        n_test=4,
        max_completion_length=4,
        batch_size=8,
    )
    return result, home


def test_an_api_run_and_its_card_name_nothing_of_the_machine(api_run):
    """The run was named `jsonl--root-.cache-corp-datasets-<hash>.jsonl__...` and its card named the home
    directory five times; the dataset is now `dataset-<hash>`."""
    result, home = api_run
    assert result.run_dir.name.startswith("jsonl-dataset-"), result.run_dir.name
    assert "home-of-the-user" not in result.run_dir.name and "cache" not in result.run_dir.name
    card = (result.model_path / "README.md").read_text()
    assert "home-of-the-user" not in card and ".cache" not in card, [
        ln for ln in card.splitlines() if "home-of-the-user" in ln or ".cache" in ln
    ]
    assert "`jsonl:dataset-" in card


def test_an_api_runs_report_names_the_dataset_not_the_cache(api_run):
    """report.json recorded `task: jsonl:<home>/.cache/corp/datasets/<hash>.jsonl`; it is now the dataset's
    name, and so is what the run prints (the report is shared; config.yaml keeps the path, to resume)."""
    result, home = api_run
    report = json.loads((result.run_dir / "report.json").read_text())
    assert report["task"].startswith("jsonl:dataset-"), report["task"]
    assert home.name not in json.dumps(report) and home.name not in result.table
    assert str(home) in (result.run_dir / "config.yaml").read_text()  # what a resume reads


def test_an_api_eval_reports_the_dataset_by_name_and_still_resumes(tiny_dir, tmp_path, monkeypatch):
    """`corp.train("eval", ...)` on a list of dicts: report.json, retention.json and the printed table name
    `dataset-<hash>`; rerun in the same output_dir, it resumes from its cache with nothing evaluated again."""
    import corp

    home = tmp_path / "home-of-the-user"
    monkeypatch.setenv("CORP_CACHE", str(home / ".cache" / "corp"))
    out = tmp_path / "ev"
    options = dict(n_test=4, n_support=0, n_probe=0, n_validation=0, max_completion_length=4, output_dir=str(out))
    options["retention"] = True  # retention.json names the run's own task too
    first = corp.train("eval", str(tiny_dir), ROWS, text_checksum, **options)
    report = json.loads((out / "report.json").read_text())
    assert report["task"].startswith("jsonl:dataset-") and home.name not in json.dumps(report), report["task"]
    assert "dataset-" in first.table and home.name not in first.table, first.table
    assert home.name not in (out / "retention.json").read_text()
    evals = (out / "evals.jsonl").read_text()
    again = corp.train("eval", str(tiny_dir), ROWS, text_checksum, **options)
    assert (out / "evals.jsonl").read_text() == evals  # resumed: every evaluation came from the cache
    assert again.report["rows"] == first.report["rows"]


def test_resuming_an_api_run_an_older_corp_split_blames_no_option(tiny_dir, tmp_path, monkeypatch):
    """A run made before e136b2f drew its splits from the dataset's cache path, not `dataset-<hash>`: the
    same rows, split seed and sizes now give other support examples, and the refusal said the split seed
    or a split size differed, which none did. It now says the examples differ and to use another output_dir."""
    import corp
    import corp.evaluate.tasks.jsonl as jsonl

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "home-of-the-user" / ".cache" / "corp"))
    options = dict(population=2, sigmas=[0.05], n_support=4, n_probe=0, n_validation=0, n_test=4)
    options.update(max_completion_length=2, output_dir=str(tmp_path / "run"))
    with monkeypatch.context() as old_corp:
        old_corp.setattr(jsonl, "shown_datasets", lambda text: text)  # the splits' seed before e136b2f
        corp.train("score", str(tiny_dir), ROWS, text_checksum, **options)
    with pytest.raises(CorpError) as exc:
        corp.train("score", str(tiny_dir), ROWS, text_checksum, **options)
    msg = str(exc.value)
    assert "other support examples" in msg and "split seed 0 and sizes are this run's" in msg, msg
    assert "differs" not in msg and "resume it with" not in msg, msg
    assert "older corp" in msg and "use another output_dir" in msg and "--" not in msg, msg  # Python's terms


def test_an_api_runs_card_reproduces_its_row_on_another_machine(api_run, tmp_path, monkeypatch):
    """The card's "`corp eval` below reproduces it" named a cache path and a Python reward `corp eval`
    refuses; an API run's card gives `corp.train("eval", ...)` and says what to supply (the rows and the
    reward function), and run as written, with another cache (another machine), it scores the test
    examples the run scored, with the same completions."""
    import re

    import corp

    result, _ = api_run
    run_dir = result.run_dir.resolve()  # relative to the directory the run was made in
    card = (run_dir / "model" / "README.md").read_text()
    code = re.search(r"```python\nimport corp  # in this directory\n\n(corp\.train\(.*\))\n```", card).group(1)
    assert "DATASET" in code and "REWARD" in code and "supply `DATASET`" in card and "`text_checksum`" in card
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "another-machine" / "cache"))
    monkeypatch.chdir(run_dir / "model")
    names = {"corp": corp, "DATASET": [dict(r) for r in ROWS], "REWARD": text_checksum}
    again = eval(code[:-1] + f", output_dir={str(tmp_path / 'ev')!r})", names)
    ran = [json.loads(x) for x in (run_dir / "evals.jsonl").read_text().splitlines()]
    accepted = json.loads((run_dir / "recipe.json").read_text())["made_by"]["accepted"]
    kind = "direction" if accepted else "base"  # the gate abstained: the saved model is the base
    saved = [r for r in ran if r["split"] == "test" and r["kind"] == kind]
    rows = [json.loads(x) for x in (again.run_dir / "evals.jsonl").read_text().splitlines()]
    assert [r["rewards"] for r in rows if r["split"] == "test"] == [saved[0]["rewards"]]
    test_ids = [json.loads((d / "splits.json").read_text())["test"] for d in (run_dir, again.run_dir)]
    assert test_ids[0] == test_ids[1]


def test_apply_records_no_absolute_path_in_corp_model_json(api_run, tmp_path, tiny_dir):
    """corp_model.json recorded the recipe's and the base's absolute paths; now paths relative to the
    output (the recipe and a local base) and the base's weights hash."""
    from corp.algorithms.recipe import apply_recipe
    from corp.runtime.models import MARKER

    result, _ = api_run
    out = apply_recipe(result.run_dir / "recipe.json", tmp_path / "applied" / "m")
    marker = json.loads((out / MARKER).read_text())
    text = json.dumps(marker)
    assert str(tmp_path) not in text and "/" + tmp_path.parts[1] + "/" not in text, marker
    assert (out / marker["recipe"]).resolve() == (result.run_dir / "recipe.json").resolve()
    assert (out / marker["base_model"]).resolve() == tiny_dir.resolve()
    assert marker["base_weights_hash"] == json.loads((result.run_dir / "recipe.json").read_text())["base_weights_hash"]


def test_the_card_says_the_first_use_converts_an_embedded_base():
    """It said `corp models` converts the base once; `corp models` lists models."""
    from corp.cards import _base_lines

    lines, _, _ = _base_lines({"model": "smollm2-135m", "model_id": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    recreate = next(ln for ln in lines if ln.startswith("- recreate the base"))
    assert "first command that uses it converts it" in recreate and "`corp models` lists it" in recreate


def test_no_committed_result_names_the_workplaces_shared_folder():
    """results/ is read on other machines: a command it records says where the benchmark data goes
    (`CORP_DATA_DIR=...`), not this workplace's `../shared` beside the clone (issue 56)."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results"
    named = [
        str(p.relative_to(results))
        for p in sorted(results.rglob("*"))
        if p.suffix in (".md", ".txt", ".yaml", ".sh") and p.is_file() and "../shared" in p.read_text(errors="replace")
    ]
    assert named == [], f"'../shared' in {named}"
