"""The runtime: where and how models run.

Engines (backends/: transformers, vLLM), the executors that spread work over processes and Ray nodes
(executors.py, ray_cluster.py, batched.py, clients.py), the run layer and its directories (context/,
runs.py, cachedir.py, ledger.py, loop.py), loading and saving models (models/), the sandbox for untrusted
programs (sandbox/), and the process's own settings (threads.py, progress.py).

A folder that groups packages: tests/test_layers.py gives each entry its own floor.
"""
