"""Multi-modal sine/line regression: VAMPIRE and MAML, the paper's Sec. 4.1 and Fig. 2.

    python -m experiments.regression                      # both methods, the CPU preset
    python -m experiments.regression --preset quick       # a few minutes on a laptop CPU
    python -m experiments.regression --preset paper       # App. A's settings, for a GPU
    python -m experiments.regression --algorithms vampire --num-meta-steps 2000

Half the tasks are A sin(x + phi), half a x + b, with 5 noisy support
points (sigma = 0.3) and a query set (`vampire_jax.data.sine_line`), drawn
in JAX from the run's seed. Each algorithm trains in `<workdir>/<algorithm>/`
(checkpoints, resume, best-on-validation), then is tested on 1000 tasks with
the paper's metrics: MSE averaged over weight draws, and quantile
calibration of the network outputs against the noiseless truth (11 levels).
The run folder gets:

  results.json                 per method: MSE +- 95% CI, NLL, ECE/MCE, the paper's MSE
  tasks.png                    a few test tasks: support, truth, each method's fit
  quantile_calibration.png     every method's reliability diagram (Fig. 2c)
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import cli, compare, plots, train
from experiments.presets import REGRESSION_PRESETS as PRESETS
from experiments.presets import RegressionConfig
from experiments.presets import regression_config as get_config
from vampire_jax.data import sine_line

# The paper's Table 2 (MSE on 1000 tasks). Fig. 2d's ECE and MCE are a bar
# chart without numbers, so only MSE is quoted.
PAPER_MSE = {"maml": 1.96, "platipus": 1.86, "bmaml": 1.12, "abml": 2.32, "vampire": 2.24}
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


class RegressionSplit(NamedTuple):
  """What a split's tasks are drawn from (the `data` of its sampler)."""

  split_id: jax.Array  # [] uint32: the splits draw disjoint streams of tasks
  query_x: jax.Array  # [n, 1] query inputs shared by every task; [0, 1]: drawn per task


def make_problem(
  config: RegressionConfig, workdir: Optional[Path] = None, print_fn=print
) -> vj.Problem:
  """The MLP, its Gaussian likelihood and the task sampler (tasks are generated, not loaded).

  The targets get noise of `data_noise_std` (default `noise_std`); the
  likelihood and the calibration metric assume `noise_std` (the likelihood
  `likelihood_std` where set). Test tasks query an even grid of
  `test_query_grid` points where set (the authors' 2019 test).
  """
  del workdir, print_fn  # nothing to record or load
  data_noise_std = config.noise_std if config.data_noise_std is None else config.data_noise_std
  sizes = dict(num_support=config.num_support, num_query=config.num_query)

  def split_keys(split: RegressionSplit, task_keys):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(task_keys, split.split_id)

  def draw(split: RegressionSplit, task_keys, make):
    fixed_x = split.query_x if split.query_x.shape[0] else None  # the shape is static
    return make(split_keys(split, task_keys), **sizes, noise_std=data_noise_std, query_x=fixed_x)

  def sample_tasks(split, task_keys):
    return draw(split, task_keys, sine_line.tasks_from_keys)

  def query_truth(split, task_keys):
    return draw(split, task_keys, sine_line.query_truth_from_keys)

  def split(name: str) -> RegressionSplit:
    grid = config.test_query_grid if name == "test" else 0
    query_x = sine_line.query_grid(grid) if grid else jnp.zeros((0, 1), jnp.float32)
    return RegressionSplit(jnp.uint32(SPLIT_IDS[name]), query_x)

  return vj.Problem(
    model=vj.MLP(tuple(config.hidden_sizes), 1, kernel_init_gain=config.kernel_init_gain),
    input_shape=(1,),
    splits={name: split(name) for name in SPLIT_IDS},
    sample_tasks=sample_tasks,
    kind="regression",
    noise_std=config.noise_std,
    query_truth=query_truth,
    data_info={
      "source": "generated: vampire_jax.data.sine_line",
      **sizes,
      "noise_std": config.noise_std,
      "data_noise_std": data_noise_std,
      "test_query_grid": config.test_query_grid,
    },
  )


def run_experiment(
  config: RegressionConfig, workdir: Path, *, progress: bool = True, print_fn=print, init_from=None
) -> dict:
  """One method: meta-trains, tests, draws its calibration and training figures."""
  return train.run_experiment(
    config,
    workdir,
    lambda: make_problem(config),
    progress=progress,
    print_fn=print_fn,
    init_from=init_from,
  )


def plot_tasks(
  key: jax.Array,
  config: RegressionConfig,
  workdirs: dict[str, Path],
  path: Path,
  num_grid: int = 200,
) -> Path:
  """Draws `num_plot_tasks` test tasks, half sinusoids and half lines, with each method's fit.

  Args:
    workdirs: `{algorithm: its run folder}`; each is loaded with `vj.load_run`.
  """
  tasks, functions = sine_line.sample_tasks_and_functions(
    key, 64, num_support=config.num_support, num_query=1, noise_std=config.noise_std
  )
  is_sine = np.asarray(functions.is_sine)
  half = config.num_plot_tasks // 2
  chosen = np.concatenate(
    [np.flatnonzero(is_sine)[: config.num_plot_tasks - half], np.flatnonzero(~is_sine)[:half]]
  )
  pick = lambda tree: jax.tree_util.tree_map(lambda v: v[chosen], tree)
  tasks, functions = pick(tasks), pick(functions)
  grid_x = jnp.linspace(*sine_line.INPUT_RANGE, num_grid)
  truth = sine_line.evaluate_functions(
    functions, jnp.broadcast_to(grid_x[None, :, None], (len(chosen), num_grid, 1))
  )
  predictions = {}
  for name, workdir in workdirs.items():
    run = vj.load_run(workdir)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(chosen))
    predictions[name.upper()] = np.stack(
      [
        np.asarray(run.predict_function_draws(sx, sy, grid_x[:, None], k))[..., 0]
        for sx, sy, k in zip(tasks.support_x, tasks.support_y, keys)
      ]
    )
  return plots.plot_regression_predictions(
    np.asarray(grid_x),
    np.asarray(truth[..., 0]),
    np.asarray(tasks.support_x[..., 0]),
    np.asarray(tasks.support_y[..., 0]),
    predictions,
    config.noise_std,
    path,
    title=f"{config.num_support}-shot test tasks: mean ±1σ/±2σ of the predictive (noise included)",
  )


def run(
  algorithms: list[str],
  preset: str,
  workdir: Path,
  overrides: Optional[argparse.Namespace | dict] = None,
  progress: bool = True,
  init_from=None,
) -> dict:
  """Trains and tests each algorithm, then writes the joint figures and results.json.

  Args:
    algorithms: e.g. `["vampire", "maml"]`, trained in turn.
    preset: one of PRESETS.
    workdir: the run folder; each algorithm trains in `workdir / algorithm`
      and resumes there if interrupted.
    overrides: config fields to change for every algorithm, e.g.
      `{"num_meta_steps": 300}` (or parsed command-line flags).
    progress: show progress.
    init_from: a trained run to start each method from (`compare.method_init_from`).
  """
  workdir = Path(workdir)
  methods = compare.run_methods(
    sys.modules[__name__], algorithms, preset, workdir, overrides or {}, progress, init_from
  )
  for name, summary in methods.items():
    summary["paper_mse"] = PAPER_MSE.get(name)
  trained = {name: workdir / name for name, m in methods.items() if "diverged" not in m}
  if not trained:
    raise compare.every_method_diverged(methods)
  config = cli.apply_overrides(get_config(preset, next(iter(trained))), overrides or {})
  figures = compare.write_comparison(
    methods,
    "regression",
    workdir,
    f"{train.setting_name(config)} ({preset} preset), {config.evaluation.num_test_tasks} test tasks",
    figure_name="quantile_calibration.png",
  )
  figures["plots"]["tasks"] = str(
    plot_tasks(jax.random.key(config.seed + 1), config, trained, workdir / "tasks.png")
  )
  combined = {
    "preset": preset,
    "methods": methods,
    **figures,
    "command": " ".join(["python -m experiments.regression"] + sys.argv[1:]),
    "date": time.strftime("%Y-%m-%d %H:%M:%S"),
  }
  (workdir / "results.json").write_text(json.dumps(combined, indent=2, default=float))
  return combined


def parse_args(argv=None):
  """`(config, args)` from the command line: `config` the first method's, `args.algorithms`
  the methods (flags as `--help` lists them)."""

  def add_flags(parser):
    parser.add_argument(
      "--algorithms",
      default="vampire,maml",
      help="comma-separated, trained in turn (default: vampire,maml)",
    )

  return cli.parse(
    argv,
    __doc__,
    PRESETS,
    get_config,
    default_preset="cpu",
    algorithm_flag=False,
    add_flags=add_flags,
  )


def main(argv=None) -> dict:
  config, args = parse_args(argv)
  algorithms = compare.parse_algorithms(args.algorithms)
  workdir = args.workdir or Path("runs") / f"regression_{args.preset}_seed{config.seed}"
  print(
    f"sine/line regression, {args.preset} preset, methods {algorithms}; workdir {workdir}; "
    f"backend {jax.default_backend()}"
  )
  results = run(algorithms, args.preset, workdir, args, not args.no_progress, args.init_from)
  print(results["table"])
  return results


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
