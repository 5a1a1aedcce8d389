"""The algorithms corp's methods share: perturbation (perturb/: noise schemes, directions), the CoRP
operator (corp_operator/: stage 1, merge rules, Gram matrix, gate), statistics (stats.py), recipes
(recipe.py) and low-rank factors (lowrank.py), federated aggregation rules (aggregation.py), and the
GRPO trainer with its loss variants (grpo/: GRPO, F-TIS, FGRPO and FERA train with it).

A folder that groups packages: tests/test_layers.py gives each entry its own floor.
"""
