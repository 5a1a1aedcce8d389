"""File-backed tasks: content hash in the signature, one-line errors naming file/line/field, field
mapping, CSV and Parquet, generation options (max_new_tokens, stop) and stop strings in generate."""

import json

import pytest

from corp.errors import CorpError
from corp.evaluate.tasks import SPLITS, SplitSizes, get_task, make_splits


def test_jsonl_signature_changes_when_the_content_changes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    before = get_task(f"jsonl:{path}").signature()
    path.write_text('{"prompt": "1+1?", "answer": "3"}\n{"prompt": "2+2?", "answer": "4"}\n')
    after = get_task(f"jsonl:{path}").signature()
    assert before["path"] == after["path"] and before != after, "a rewritten file must not look like the same task"


@pytest.mark.parametrize(
    "name, files",
    [
        (
            "gsm8k",
            {
                "gsm8k/train.jsonl": '{"question": "q", "answer": "x #### 1"}\n',
                "gsm8k/test.jsonl": '{"question": "q2", "answer": "y #### 2"}\n',
            },
        ),
        ("math500", {"math500/test.jsonl": '{"unique_id": "a", "problem": "p", "answer": "1"}\n'}),
        ("mbpp", {"mbpp/mbpp.jsonl": '{"task_id": 1}\n'}),
        ("humaneval", {"humaneval/HumanEval.jsonl": '{"task_id": "HumanEval/0"}\n'}),
    ],
)
def test_benchmark_signature_holds_the_data_files_hash(tmp_path, name, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    before = get_task(name, str(tmp_path)).signature()
    rel = next(iter(files))
    (tmp_path / rel).write_text(files[rel] + files[rel].replace('"q', '"other q'))
    after = get_task(name, str(tmp_path)).signature()
    assert before["data_sha256"][rel] != after["data_sha256"][rel]


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n', r"t\.jsonl' line 2 is not UTF-8"),
        (
            b'{"prompt": null, "answer": "1"}\n',
            r"t\.jsonl' line 1: field 'prompt' must be a non-empty string, got NoneType",
        ),
        (
            b'{"prompt": "ok", "answer": "1"}\n{"prompt": 7, "answer": "1"}\n',
            r"line 2: field 'prompt' must be a non-empty string, got int",
        ),
        (b'{"prompt": "ok"}\n', r"line 1: missing field 'answer'"),
        (b'{"prompt": "ok", "answer": null}\n', r"line 1: field 'answer' must be a string or a number, got null"),
        (
            b'{"prompt": "ok", "answer": "1", "id": 1}\n{"prompt": "ok2", "answer": "1", "id": 1}\n',
            r"line 2: id '1' already used on line 1",
        ),
    ],
)
def test_bad_jsonl_is_one_error_naming_file_line_and_field(tmp_path, content, message):
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    with pytest.raises(CorpError, match=message):
        get_task(f"jsonl:{path}").pools()


def test_jsonl_naming_a_directory_is_an_error(tmp_path):
    with pytest.raises(CorpError, match="is a directory"):
        get_task(f"jsonl:{tmp_path}")


def test_field_mapping_csv_and_parquet(tmp_path):
    rows = [
        {"question": f"What is {i} + 1?", "solution": str(i + 1), "qid": f"q{i}", "level": i % 3} for i in range(12)
    ]
    jl = tmp_path / "m.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(f"jsonl:{jl}:prompt=question,answer=solution,id=qid")
    pool = task.pools()["train"]
    assert [e.id for e in pool][:2] == ["q0", "q1"] and pool[3].prompt == "What is 3 + 1?" and pool[3].answer == "4"
    assert pool[3].columns == {"level": 0}, "mapped fields are not repeated as columns; others are"
    assert task.signature()["fields"] == {"prompt": "question", "answer": "solution", "id": "qid"}
    with pytest.raises(
        CorpError,
        match=r"m\.jsonl' line 1: missing field 'prompt'.*fields present: level, qid, question, solution.*prompt=FIELD",
    ):
        get_task(f"jsonl:{jl}").pools()

    csv_path = tmp_path / "m.csv"
    csv_path.write_text(
        "question,solution,note\n"
        + "".join(f'"What is {i}, plus one?",{i + 1},"multi\nline"\n' for i in range(5))
        + "bad,row\n"
    )
    with pytest.raises(CorpError, match=r"m\.csv' line 12: 2 fields, the header has 3"):
        get_task(f"jsonl:{csv_path}:prompt=question,answer=solution").pools()
    csv_path.write_text("question,solution\n" + "".join(f'"What is {i}, plus one?",{i + 1}\n' for i in range(5)))
    pool = get_task(f"jsonl:{csv_path}:prompt=question,answer=solution").pools()["train"]
    assert (
        len(pool) == 5 and pool[2].prompt == "What is 2, plus one?" and pool[2].answer == "3" and pool[2].id == "line-4"
    )

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq_path = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path)
    task = get_task(f"jsonl:{pq_path}:prompt=question,answer=solution,id=qid")
    assert [e.answer for e in task.pools()["train"]] == [r["solution"] for r in rows]
    sp = make_splits(task, SplitSizes(4, 2, 2, 4), 0)
    assert sum(len(sp[s]) for s in SPLITS) == 12
    with pytest.raises(CorpError, match="no option"):
        get_task(f"jsonl:{pq_path}:question=prompt")


def test_generation_options_for_any_task():
    task = get_task("arith:digits=2,max_new_tokens=12,stop=\\n|###|a\\|b")
    assert task.max_new_tokens == 12 and task.stop == ("\n", "###", "a|b")
    assert task.signature()["stop"] == ["\n", "###", "a|b"] and task.signature()["digits"] == 2
    assert get_task("arith").stop == () and "stop" not in get_task("arith").signature()
    with pytest.raises(CorpError, match="max_new_tokens"):
        get_task("arith:max_new_tokens=0")


def test_hf_generate_stops_at_a_stop_string(tiny_backend):
    prompts = ["12+34=", "hello"]
    full = tiny_backend.generate(prompts, 24)
    text = full.texts[0]
    # a character that occurs after the first few generated tokens (the random model emits varied characters)
    pos = next(i for i in range(2, len(text)) if text[i] not in text[:i] and text[i].strip())
    stop = text[pos]
    cut = tiny_backend.generate(prompts, 24, stop=(stop,))
    assert cut.texts[0] == text[:pos], "text must end right before the stop string"
    assert cut.generated_tokens[0] == pos + 1, "tokens up to and including the one that completed the stop"
    other = full.texts[1]
    assert cut.texts[1] == (other[: other.index(stop)] if stop in other else other)


def test_an_option_of_the_wrong_type_is_one_error():
    with pytest.raises(CorpError, match="arith:digits=abc.*wrong type"):
        get_task("arith:digits=abc")


# ------------------------------------------------ benchmark data from the hub when no local files are given


def _fake_datasets(monkeypatch, calls, fail=False):
    """A stand-in `datasets` module: load_dataset returns rows per split (or fails like an offline machine)."""
    import sys
    import types

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if fail:
            raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore detail")
        if name == "google-research-datasets/mbpp":
            start = {"train": 11, "test": 511, "validation": 1, "prompt": 2}[split]
            return [
                {
                    "task_id": start + i,
                    "text": f"t{start + i}",
                    "code": "",
                    "test_list": [],
                    "test_setup_code": "",
                    "challenge_test_list": [],
                }
                for i in range(2)
            ]
        return [{"question": f"{split} q{i}", "answer": f"#### {i}"} for i in range(3)]

    import importlib.machinery

    mod = types.ModuleType("datasets")
    mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    mod.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setattr(
        "corp.evaluate.tasks.data.hub_offline", lambda: False
    )  # the fake stands in for a hub that answers


def test_without_local_data_benchmark_files_come_from_the_hub_once_and_keep_their_fields(tmp_path, monkeypatch):
    import json

    from corp.evaluate.tasks.data import data_file

    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    calls: list = []
    _fake_datasets(monkeypatch, calls)
    path = data_file("gsm8k", "gsm8k/test.jsonl")
    assert path == tmp_path / "cache" / "data" / "gsm8k" / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {"question": "test q0", "answer": "#### 0"} and len(rows) == 3
    assert calls == [("openai/gsm8k", "main", "test")]
    assert data_file("gsm8k", "gsm8k/test.jsonl") == path and len(calls) == 1  # cached: not fetched again
    mbpp = [json.loads(line)["task_id"] for line in data_file("mbpp", "mbpp/mbpp.jsonl").read_text().splitlines()]
    assert mbpp == sorted(mbpp) and len(mbpp) == 8  # four hub splits, back in task_id order like mbpp.jsonl


def test_hub_failure_or_missing_datasets_is_one_line_naming_both_ways(tmp_path, monkeypatch):
    import importlib.util

    from corp.errors import CorpError
    from corp.evaluate.tasks.data import data_file

    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    _fake_datasets(monkeypatch, [], fail=True)
    with pytest.raises(CorpError) as exc:
        data_file("gsm8k", "gsm8k/test.jsonl")
    msg = str(exc.value)
    assert "\n" not in msg and "CORP_DATA_DIR" in msg and "openai/gsm8k" in msg and "hub" in msg
    assert not (tmp_path / "cache" / "data" / "gsm8k" / "test.jsonl").exists()  # nothing half-written

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real_find_spec(name, *a)
    )
    with pytest.raises(CorpError) as exc:
        data_file("math500", "math500/test.jsonl")
    assert "pip install 'corp[hub]'" in str(exc.value) and "CORP_DATA_DIR" in str(exc.value)


def test_hub_data_offline_is_one_line_without_asking_the_hub(tmp_path, monkeypatch):
    """A hub that does not answer: one line naming the task's files and --data, and no load_dataset
    call (whose retries printed 'Retrying in 8s' for half a minute)."""
    from corp.errors import CorpError
    from corp.evaluate.tasks.data import data_file

    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    calls: list = []
    _fake_datasets(monkeypatch, calls)
    monkeypatch.setattr("corp.evaluate.tasks.data.hub_offline", lambda: True)
    with pytest.raises(CorpError) as exc:
        data_file("gsm8k", "gsm8k/train.jsonl")
    msg = str(exc.value)
    assert "\n" not in msg and "gsm8k/train.jsonl and gsm8k/test.jsonl" in msg and "--data DIR" in msg
    assert calls == []


def test_a_given_data_directory_never_falls_back_to_the_hub(tmp_path, monkeypatch):
    from corp.errors import CorpError
    from corp.evaluate.tasks.data import data_file

    calls: list = []
    _fake_datasets(monkeypatch, calls)
    monkeypatch.delenv("CORP_DATA_DIR", raising=False)
    monkeypatch.setenv("CORP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CorpError, match="Pass --data DIR"):
        data_file("gsm8k", "gsm8k/test.jsonl", data_dir=tmp_path / "empty")
    assert calls == []
