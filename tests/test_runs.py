import pytest

from corp import CorpError
from corp.runs import append_jsonl, read_jsonl


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    p = tmp_path / "population.jsonl"
    append_jsonl(p, {"key": "a", "v": 1})
    append_jsonl(p, {"key": "b", "v": 2})
    with open(p, "a") as fh:
        fh.write('{"key": "c", "v"')  # killed mid-write
    rows = read_jsonl(p, key="key")
    assert [r["key"] for r in rows] == ["a", "b"]
    append_jsonl(p, {"key": "c", "v": 3})
    assert [r["key"] for r in read_jsonl(p, key="key")] == ["a", "b", "c"]


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "population.jsonl"
    p.write_text('{"key": "a"}\ngarbage\n{"key": "b"}\n')
    with pytest.raises(CorpError, match="line 2"):
        read_jsonl(p, key="key")
