"""Many parties, one task: shared client machinery (non-IID client split, wire messages, client
pools with a drop-on-death rule, aggregation rules) and corp's federated weight-space method.

Layers: `clients.py` and `aggregation.py` import no method; `fedcorp.py` (federated CoRP) and
`corp/baselines/fgrpo.py` (FGRPO) build on them. F-TIS / FERA can reuse `split_clients`,
`check_signatures`, `ClientPool` and the message codec.

The names below are this package's public surface: code outside `corp.federated` imports them from
here (`from corp.federated import split_clients`), never from a submodule (tests/test_layers.py).
"""

from corp.federated.aggregation import ema_update, fedavg_weights, fgrpo_weights, relative_gains, weighted_sum
from corp.federated.clients import SPLIT_RULES, ClientBase, ClientPool, check_signatures, partition_ids, split_clients
from corp.federated.fedcorp import FedCorpConfig, run_fedcorp

__all__ = [
    "SPLIT_RULES",
    "ClientBase",
    "ClientPool",
    "FedCorpConfig",
    "check_signatures",
    "ema_update",
    "fedavg_weights",
    "fgrpo_weights",
    "partition_ids",
    "relative_gains",
    "run_fedcorp",
    "split_clients",
    "weighted_sum",
]
