"""The bench's scheduler, kept apart from what a cell is and what it may spend (corp.bench.plan,
corp.bench.cells): which process runs which cell, and when.

- `claims.py`: a cell's claim (an flock per cell), so several processes, local or Ray tasks, never
  run one cell twice; `attempt` runs a cell unless another process holds it.
- `passes.py`: the local path, passes over the plan until no cell is deferred.
- `ray_cells.py`: `corp bench --executor ray`, the cells as Ray tasks, in the order their records
  depend on.
"""
