"""The CoRP operator (arXiv 2605.31494; docs/methods.md "CoRP"), in the core: stage 1 on a rewarded
population of seeded perturbations (elite set, merge rules, Gram matrix and compatibility terms,
step search on the probe split) and the paired validation gate.

Two methods run it, so it lives below the algorithm packages (docs/architecture.md, "Layers"):
`corp consolidate` (`corp/methods/consolidate/`: the population run, stage 2, low-rank consolidation, the
report) and `corp fedcorp` (`corp/methods/fedcorp/run.py`: stage 1 with federated rewards, probe and
gate). Its modules: `config` (OperatorConfig), `algebra`, `merge_rules/`, `gate`, `corp_operator`
(stage 1, the step search, the gates). Import from the module that defines a name.
"""
