"""Issue 57: what corp writes and says names nothing of the user's machine it was not given, and a
path the user typed is treated as a path."""

from __future__ import annotations

import pytest

from corp import CorpError
from corp.models import check_model_reachable, resolve_model


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
