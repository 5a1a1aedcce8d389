"""What a model is scored on and how: tasks (tasks/), rewards (rewards.py), scoring a population
(scorer.py, population.py, racing.py), voting and pass@k (voting.py, passk.py), retention (retention.py).
The engines and executors they run on are corp/runtime/.

A folder that groups packages: tests/test_layers.py gives each entry its own floor.
"""
