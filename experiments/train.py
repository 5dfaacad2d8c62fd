"""What every experiment's `train_and_evaluate(config, workdir)` does, once.

Check the config (before any data is read or anything compiled), that
`workdir` can be written, is not in use by another process and holds no run
of another config; build the problem (load the data);
run the library's loop (`vj.train_and_evaluate`); draw the run's figures.
"""

from pathlib import Path
from typing import Callable

import jax

import vampire_jax as vj
from experiments import plots
from vampire_jax import run_folder


def train_and_evaluate(config, workdir: Path, make_problem: Callable[[], vj.Problem], *,
                       progress: bool = True, print_fn=print) -> dict:
  """Runs one experiment; returns the results written to `workdir/results.json`.

  Args:
    config: the experiment's config.
    workdir: the run folder (resumed if it holds this config's run).
    make_problem: loads the data and builds the `vj.Problem`; called only
      once the config is known to be valid.
    progress: show progress.
    print_fn: where messages go.
  """
  vj.training.check_config(config)
  if jax.process_index() == 0:
    run_folder.check_writable(workdir)
    run_folder.check_not_in_use(workdir)
  vj.training.check_resumable(workdir, config)
  results = vj.train_and_evaluate(make_problem(), config, workdir, progress=progress,
                                  print_fn=print_fn)
  return plots.add_run_figures(workdir, results, config.algorithm.upper())
