"""Federated CoRP (`corp fedcorp`): CoRP stage 1 across K clients that never share data.

Layers: `combine.py` (how clients' rewards are combined, fedcorp's own) and `fedcorp.py` (the
command). What fedcorp shares with other methods is in the core, since algorithm packages never
import each other (tests/test_layers.py): the client machinery (non-IID client split, wire
messages, client pools with a drop-on-death rule: `corp/clients.py`, which FGRPO and FERA use
too), the aggregation rules (`corp/aggregation.py`), the CoRP operator (`corp/operator/`) and the
recipe (`corp/recipe.py`).

The names below are this package's public surface: code outside `corp.federated` imports them from
here (`from corp.federated import run_fedcorp`), never from a submodule (tests/test_layers.py).
"""

from corp.federated.fedcorp import FedCorpConfig, run_fedcorp

__all__ = ["FedCorpConfig", "run_fedcorp"]
