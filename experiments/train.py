"""What every experiment's `train_and_evaluate(config, workdir)` does, once.

Check the config (before any data is read or anything compiled), that
`workdir` can be written, is not in use by another process and holds no run
of another config; build the problem (load the data);
run the library's loop (`vj.train_and_evaluate`); draw the run's figures
(and add them to its TensorBoard events).
"""

from pathlib import Path
from typing import Callable

import jax

import vampire_jax as vj
from experiments import plots
from vampire_jax import reporting, run_folder


def train_and_evaluate(
  config,
  workdir: Path,
  make_problem: Callable[[], vj.Problem],
  *,
  progress: bool = True,
  print_fn=print,
) -> dict:
  """Runs one experiment; returns the results written to `workdir/results.json`.

  Args:
    config: the experiment's config.
    workdir: the run folder (resumed if it holds this config's run).
    make_problem: loads the data and builds the `vj.Problem`; called only
      once the config is known to be valid.
    progress: show progress.
    print_fn: where messages go.
  """
  vj.algorithms.check_config(config)
  if jax.process_index() == 0:
    run_folder.check_writable(workdir)
    run_folder.check_not_in_use(workdir)
  vj.run_folder.check_resumable(workdir, config)
  results = vj.train_and_evaluate(
    make_problem(), config, workdir, progress=progress, print_fn=print_fn
  )
  results = plots.add_run_figures(workdir, results, config.algorithm.upper(), setting_name(config))
  if jax.process_index() == 0:
    reporting.write_figures(workdir, results["plots"], step=results["meta_steps"])
  return results


def setting_name(config) -> str:
  """The data set and setting a figure's title names, e.g. "Omniglot 5-way 1-shot"."""
  if isinstance(config, vj.configs.RegressionConfig):
    return f"sine/line regression, {config.num_support}-shot"
  if isinstance(config, vj.configs.OmniglotConfig):
    data = "Omniglot"
  elif isinstance(config, vj.configs.MiniImagenetConfig):
    data = "mini-ImageNet"
  elif isinstance(config, vj.configs.FeaturesConfig):
    data = f"{config.dataset}-ImageNet (LEO features)"
  else:
    data = type(config).__name__.removesuffix("Config")
  ways, shots = getattr(config, "ways", None), getattr(config, "shots", None)
  return data if ways is None or shots is None else f"{data} {ways}-way {shots}-shot"
