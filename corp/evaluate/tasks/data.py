"""Where benchmark data files are found: `--data PATH`, then `$CORP_DATA_DIR`, then an error.

Nothing is downloaded at run time (the hub is not reachable from the machines this runs on);
the message says where to put the files. See the shared data README for provenance.
"""

from __future__ import annotations

import os
from pathlib import Path

from corp import CorpError


def data_file(task: str, relative: str, data_dir: str | Path | None = None) -> Path:
    roots = [Path(p) for p in (data_dir, os.environ.get("CORP_DATA_DIR")) if p]
    for root in roots:
        for candidate in (root / relative, root / task / Path(relative).name, root / Path(relative).name):
            if candidate.is_file():
                return candidate
    looked = ", ".join(str(r / relative) for r in roots) or "nowhere: neither --data nor $CORP_DATA_DIR is set"
    raise CorpError(f"task '{task}' needs data file '{relative}'; looked in {looked}. Pass --data DIR or set CORP_DATA_DIR")
