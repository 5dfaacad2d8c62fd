"""What every experiment's `run_experiment(config, workdir)` does, once.

Run the library's `vj.train_and_evaluate` with the function that builds the
problem (it checks the config and the folder before the data is loaded), then
draw the run's figures (and add them to its TensorBoard events).
"""

from pathlib import Path
from typing import Callable

import jax

import vampire_jax as vj
from experiments import plots
from vampire_jax._src.runs import experiment_configs as configs
from vampire_jax._src.runs import reporting


def run_experiment(
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
  results = vj.train_and_evaluate(
    make_problem, config, workdir, progress=progress, print_fn=print_fn
  )
  results = plots.add_run_figures(workdir, results, config.algorithm.upper(), setting_name(config))
  if jax.process_index() == 0:
    reporting.write_figures(workdir, results["plots"], step=results["meta_steps"])
  return results


def setting_name(config) -> str:
  """The data set and setting a figure's title names, e.g. "Omniglot 5-way 1-shot"."""
  if isinstance(config, configs.RegressionConfig):
    return f"sine/line regression, {config.num_support}-shot"
  if isinstance(config, configs.OmniglotConfig):
    data = "Omniglot"
  elif isinstance(config, configs.MiniImagenetConfig):
    data = "mini-ImageNet"
  elif isinstance(config, configs.FeaturesConfig):
    data = f"{config.dataset}-ImageNet (LEO features)"
  else:
    data = type(config).__name__.removesuffix("Config")
  ways, shots = getattr(config, "ways", None), getattr(config, "shots", None)
  return data if ways is None or shots is None else f"{data} {ways}-way {shots}-shot"
