"""Many parties, one task: shared client machinery (non-IID client split, wire messages, client
pools with a drop-on-death rule, aggregation rules) and corp's federated weight-space method.

Layers: `clients.py` and `aggregation.py` import no method; `fedcorp.py` (federated CoRP) and
`corp/baselines/fgrpo.py` (FGRPO) build on them. F-TIS / FERA can reuse `split_clients`,
`check_signatures`, `ClientPool` and the message codec.
"""
