"""corp's own cache directory on this machine, the datasets the Python API stores in it, and the name
every output shows for such a dataset (`dataset-<hash>`, never its path: the user gave corp an object).

A ground-floor module that imports nothing of corp, so that `corp.runtime.runs` (which writes every report)
and `corp.runtime.models` (which `corp.runtime.runs` cannot import: `corp.runtime.models` imports `corp.runtime.runs`) both use it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("CORP_CACHE", Path.home() / ".cache" / "corp"))


def datasets_dir() -> Path:
    """Where the Python API stores a dataset object, as `<sha256 prefix>.jsonl` (corp.api)."""
    return cache_dir() / "datasets"


def shown_datasets(text: str) -> str:
    """`text` with the path of every dataset the Python API stored replaced by its name `dataset-<hash>`:
    the user gave corp an object, not that path, so a run's name, report and card say nothing of where
    the cache is (a path the user typed, `--task jsonl:FILE`, is left as it is)."""
    for folder in dict.fromkeys((str(datasets_dir()), str(datasets_dir().resolve()))):
        text = re.sub(re.escape(folder + os.sep) + r"([0-9a-f]+)\.jsonl", r"dataset-\1", text)
    return text
