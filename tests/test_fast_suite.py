"""tests/fast_suite.py: which test files the fast suite leaves unimported, and which corp modules it missed."""

from __future__ import annotations

import pytest

from tests.fast_suite import marked_slow, uncovered


@pytest.mark.parametrize(
    ("source", "slow"),
    [
        ("import pytest\n\npytestmark = pytest.mark.slow\n", True),
        ("import pytest\n\npytestmark = [pytest.mark.embedded, pytest.mark.slow]\n", True),
        ("from pytest import mark\n\npytestmark = (mark.slow,)\n", True),
        ("import pytest\n\npytestmark = pytest.mark.embedded\n", False),
        ("import pytest\n\n\n@pytest.mark.slow\ndef test_one():\n    pass\n", False),  # one test, not the file
        ("import pytest\n\n\ndef test_one():\n    pytestmark = pytest.mark.slow\n", False),  # not at module level
    ],
)
def test_a_file_is_slow_as_a_whole_only_by_its_module_level_pytestmark(tmp_path, source, slow):
    path = tmp_path / "test_x.py"
    path.write_text(source)
    assert marked_slow(path) is slow


def test_a_module_no_fast_test_imported_is_named(tmp_path):
    pkg = tmp_path / "corp"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (pkg / name).write_text("")
    assert uncovered(["corp", "corp.a", "corp.sub", "json"], pkg) == ["corp.sub.b"]
    assert uncovered(["corp", "corp.a", "corp.sub", "corp.sub.b"], pkg) == []
