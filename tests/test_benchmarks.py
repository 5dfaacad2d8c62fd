"""The benchmark suite runs and counts FLOPs that scale with the work."""

import pytest

from benchmarks import suite


@pytest.mark.slow
def test_suite_row_counts_flops_in_proportion_to_tasks():
  options = {"quick": True, "tasks": 2, "repeats": 1, "batching": None, "scan_inner_steps": False,
             "remat": False, "compute_dtype": "float32", "peak_tflops": None}
  two = suite.run_row("regression", "maml", options)
  four = suite.run_row("regression", "maml", dict(options, tasks=4))
  assert two["tasks"] == 2 and two["step_s"] > 0 and two["loss_finite"]
  # Twice the tasks, twice the work (up to the shared optimiser update).
  assert four["gflop_per_step"] == pytest.approx(2 * two["gflop_per_step"], rel=0.05)
  assert four["compiled_gflop_per_step"] == pytest.approx(2 * two["compiled_gflop_per_step"], rel=0.05)
  table = suite.format_table([two, four])
  assert table.count("\n") == 3 and "| regression | maml | 4 |" in table
