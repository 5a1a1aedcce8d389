"""Federated CoRP (`corp fedcorp`): CoRP stage 1 across K clients that never share data.

Layers: `combine.py` (how clients' rewards are combined, fedcorp's own) and `run.py` (the
command). What fedcorp shares with other methods is in the core, since algorithm packages never
import each other (tests/test_layers.py): the client machinery (non-IID client split, wire
messages, client pools with a drop-on-death rule: `corp/runtime/clients.py`, which FGRPO and FERA use
too), the aggregation rules (`corp/algorithms/aggregation.py`), the CoRP operator (`corp/algorithms/corp_operator/`) and the
recipe (`corp/algorithms/recipe.py`).

The names below are this package's public surface: code outside `corp.methods.fedcorp` imports them from
here (`from corp.methods.fedcorp import run_fedcorp`), never from a submodule (tests/test_layers.py).
"""

from corp.method import SMALL, Method
from corp.methods.fedcorp.run import NAME, FedCorpConfig, run_fedcorp

# registered, no bench adapter: the bench lists it as not run at a budget (corp.bench.plan.plan)
METHOD = Method(
    NAME,
    FedCorpConfig,
    run_fedcorp,
    "Federated weight space: K clients score the same seeds on private data; "
    "only (seed, reward) pairs, candidates and verdicts travel; CoRP stage 1 "
    "on the combined rewards, gated by each client (recipe.json + model/).",
    recipes=("corp-direction",),
    model=True,
    smoke={
        **SMALL,
        "population": 4,
        "sigmas": "0.05",
        "alphas": "1,2",
        "clients": 2,
        "split_by": "iid",
        "gate_z": -10.0,
    },
)

__all__ = ["METHOD", "FedCorpConfig", "run_fedcorp"]
