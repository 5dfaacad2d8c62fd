"""Multi-modal sine/line regression: VAMPIRE and MAML, the paper's Sec. 4.1 and Fig. 2.

    python -m experiments.regression                      # both methods, the CPU preset
    python -m experiments.regression --preset quick       # a few minutes on a laptop CPU
    python -m experiments.regression --preset paper       # App. A's settings, for a GPU
    python -m experiments.regression --algorithms vampire --num-meta-steps 2000

Half the tasks are A sin(x + phi), half a x + b, with 5 noisy support
points (sigma = 0.3) and a query set (`vampire_jax.data.sine_line`); tasks
are drawn in JAX from the run's seed. Each algorithm is meta-trained with the
shared runner (checkpoints, resume, best-on-validation, TensorBoard) in
`<workdir>/<algorithm>/`, then tested on 1000 tasks. The run folder gets:

  results.json                 MSE +- 95% CI, NLL, quantile ECE/MCE per method, the paper's values
  tasks.png                    a few test tasks: support, truth, MAML, VAMPIRE mean +-1/2 sigma
  quantile_calibration.png     the reliability diagram of every method (Fig. 2c)
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import cli, runner
from vampire_jax import plotting
from vampire_jax.data import sine_line

# The paper's Table 2 (MSE on 1000 tasks) and Fig. 2d (ECE, MCE are read off a
# bar chart and not given as numbers, so only MSE is quoted).
PAPER_MSE = {"maml": 1.96, "platipus": 1.86, "bmaml": 1.12, "abml": 2.32, "vampire": 2.24}
SPLITS = ("train", "val", "test")


@dataclasses.dataclass
class RegressionConfig(runner.RunConfig):
  """The paper's regression settings (App. A, Table 6); the rest from RunConfig."""
  tasks_per_step: int = 10             # T
  num_meta_steps: int = 10_000
  inner_lr: float = 0.001              # alpha
  kl_weight: float = 1.0               # beta: the plain VFE, no weighting
  num_mc_train: int = 128              # L_t
  num_mc_query: int = 128              # L_v
  num_mc_test: int = 128
  task_batching: str = "vmap"          # an MLP: vmap beats host-chunking on a CPU too
  eval_task_batching: str = "vmap"
  num_val_tasks: int = 200
  num_test_tasks: int = 1000
  eval_batch_tasks: int = 10           # x 128 draws: ~3 GB at a time
  eval_every: int = 1000
  checkpoint_every: int = 1000
  log_every: int = 100
  num_support: int = 5                 # k-shot
  num_query: int = 10                  # not given in the paper
  noise_std: float = sine_line.NOISE_STD
  hidden_sizes: tuple[int, int, int] = (100, 100, 100)
  num_plot_tasks: int = 4


PRESETS = ("cpu", "paper", "quick")


def get_config(preset: str = "cpu", algorithm: str = "vampire") -> RegressionConfig:
  """Settings per preset; MAML gets the same schedule with one draw and no KL.

  Presets:
    paper: App. A (T=10, L_t=L_v=128) for the authors' 50 000 meta-steps
      (their 50 epochs of 10 000 tasks); sized for a GPU.
    cpu: the default; the paper's settings with L_t=L_v=8 during training
      (128 at test) and 3000 meta-steps, so both methods finish on a 2-core
      CPU (times in BUILD_NOTES.md).
    quick: 500 meta-steps, L=8, 500 test tasks with 32 draws: a smoke run for
      tests and notebooks.
  """
  if preset == "paper":
    config = RegressionConfig(num_meta_steps=50_000, eval_every=2500, checkpoint_every=2500)
  elif preset == "cpu":
    config = RegressionConfig(num_meta_steps=3000, num_mc_train=8, num_mc_query=8,
                              num_val_tasks=100, eval_every=500, checkpoint_every=500)
  elif preset == "quick":
    config = RegressionConfig(num_meta_steps=500, num_mc_train=8, num_mc_query=8,
                              num_mc_test=32, num_val_tasks=100, num_test_tasks=500,
                              eval_every=250, checkpoint_every=250, log_every=50)
  else:
    raise ValueError(f"unknown preset {preset!r}; expected one of {PRESETS}")
  config.algorithm = algorithm
  if algorithm in ("maml", "fomaml"):  # point estimates: no KL, one draw
    config = dataclasses.replace(config, kl_weight=0.0, num_mc_train=1, num_mc_query=1,
                                 num_mc_test=1)
  return config


def make_problem(config: RegressionConfig) -> runner.Problem:
  """The MLP, its Gaussian likelihood and the task sampler."""
  if config.noise_std <= 0:
    raise ValueError(f"noise_std must be > 0, got {config.noise_std}")
  model = vj.MLP(tuple(config.hidden_sizes), 1)

  def sample_tasks(split, key, num_tasks):
    key = jax.random.fold_in(key, SPLITS.index(split))
    return sine_line.sample_tasks(key, num_tasks, num_support=config.num_support,
                                  num_query=config.num_query, noise_std=config.noise_std)

  return runner.Problem(
      apply_fn=vj.pure_apply(model),
      init_params=lambda key: vj.init_params(model, key, (1, 1)),
      nll=vj.gaussian_nll(config.noise_std), sample_tasks=sample_tasks, kind="regression",
      noise_std=config.noise_std)


def predict_on_grid(problem: runner.Problem, config: RegressionConfig, meta_params,
                    support_x: jax.Array, support_y: jax.Array, grid_x: jax.Array,
                    key: jax.Array) -> np.ndarray:
  """Adapts to each task's support set and predicts on `grid_x`.

  Args:
    support_x, support_y: `[tasks, shots, 1]`.
    grid_x: `[points]`.

  Returns:
    `[tasks, num_samples, points]` outputs (num_samples = `num_mc_test`, 1 for MAML).
  """
  learner = runner.make_learner(problem, config, config.num_mc_test, config.num_mc_test)

  def one_task(sx, sy, task_key):
    adapt_key, predict_key = jax.random.split(task_key)
    task_params = learner.adapt(meta_params, sx, sy, adapt_key)
    return learner.predict(task_params, grid_x[:, None], predict_key)[..., 0]

  keys = jax.random.split(key, support_x.shape[0])
  return np.asarray(jax.jit(jax.vmap(one_task))(support_x, support_y, keys))


def plot_tasks(key: jax.Array, config: RegressionConfig, trained: dict, path: Path,
               num_grid: int = 200) -> Path:
  """Draws `num_plot_tasks` test tasks, half sinusoids and half lines, with each method's fit.

  Args:
    trained: `{algorithm: (problem, config, meta_params)}`.
  """
  task_key, predict_key = jax.random.split(key)
  tasks, functions = sine_line.sample_tasks_and_functions(
      task_key, 64, num_support=config.num_support, num_query=1, noise_std=config.noise_std)
  is_sine = np.asarray(functions.is_sine)
  half = config.num_plot_tasks // 2
  chosen = np.concatenate([np.flatnonzero(is_sine)[:config.num_plot_tasks - half],
                           np.flatnonzero(~is_sine)[:half]])
  pick = lambda tree: jax.tree_util.tree_map(lambda v: v[chosen], tree)
  tasks, functions = pick(tasks), pick(functions)
  grid_x = jnp.linspace(*sine_line.INPUT_RANGE, num_grid)
  truth = sine_line.evaluate_functions(functions, jnp.broadcast_to(grid_x[None, :, None],
                                                                   (len(chosen), num_grid, 1)))
  predictions = {
      name.upper(): predict_on_grid(problem, run_config, meta_params, tasks.support_x,
                                    tasks.support_y, grid_x, predict_key)
      for name, (problem, run_config, meta_params) in trained.items()}
  return plotting.plot_regression_predictions(
      np.asarray(grid_x), np.asarray(truth[..., 0]), np.asarray(tasks.support_x[..., 0]),
      np.asarray(tasks.support_y[..., 0]), predictions, config.noise_std, path,
      title=f"{config.num_support}-shot test tasks: mean ±1σ/±2σ of the predictive (noise included)")


def run(algorithms: list[str], preset: str, workdir: Path,
        overrides: Optional[argparse.Namespace | dict] = None, progress: bool = True) -> dict:
  """Trains and tests each algorithm, then writes the joint figures and results.json.

  Args:
    algorithms: e.g. `["vampire", "maml"]`, trained in turn.
    preset: one of PRESETS.
    workdir: the run folder; each algorithm trains in `workdir / algorithm`
      and resumes there if interrupted.
    overrides: config fields to change for every algorithm, e.g.
      `{"num_meta_steps": 300}` (or parsed command-line flags).
    progress: show progress bars.
  """
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  trained, summaries, quantiles = {}, {}, {}
  for algorithm in algorithms:
    config = get_config(preset, algorithm)
    if overrides is not None:
      config = cli.apply_overrides(config, overrides)
      config.algorithm = algorithm
    problem = make_problem(config)
    print(f"== {algorithm}: T={config.tasks_per_step}, {config.num_meta_steps} steps, "
          f"L_t={config.num_mc_train}, L_v={config.num_mc_query}, inner lr {config.inner_lr}, "
          f"KL weight {config.kl_weight}; {workdir / algorithm}")
    try:
      results = runner.train_and_evaluate(problem, config, workdir / algorithm, progress=progress)
    except FloatingPointError as error:  # recorded, and the other methods still run
      print(f"   {algorithm}: {error}")
      summaries[algorithm] = dict(diverged=str(error), paper_mse=PAPER_MSE.get(algorithm),
                                  config=dataclasses.asdict(config))
      continue
    meta_params = runner.restore_meta_params(problem, config, workdir / algorithm)
    trained[algorithm] = (problem, config, meta_params)
    summaries[algorithm] = dict(results["test"], wall_time_s=results["wall_time_s"],
                                paper_mse=PAPER_MSE.get(algorithm),
                                config=dataclasses.asdict(config),
                                calibration=results["calibration"])
    quantiles[algorithm.upper()] = runner.calibration_from_record(results["calibration"])
    test = results["test"]
    print(f"   {algorithm}: test MSE {test['mse']:.3f} +- {test['mse_ci95']:.3f}, NLL "
          f"{test['nll']:.3f}, ECE {test['ece']:.4f}, MCE {test['mce']:.4f} "
          f"({test['num_tasks']} tasks; paper MSE {PAPER_MSE.get(algorithm)})")

  if not trained:
    raise FloatingPointError(f"every method diverged: {summaries}")
  first = next(iter(trained.values()))[1]
  plots = {
      "tasks": str(plot_tasks(jax.random.key(first.seed + 1), first, trained,
                              workdir / "tasks.png")),
      "quantile_calibration": str(plotting.plot_quantile_calibration(
          quantiles, workdir / "quantile_calibration.png",
          title=f"Quantile calibration, {first.num_test_tasks} test tasks")),
  }
  combined = {"preset": preset, "methods": summaries, "plots": plots,
              "command": " ".join(["python -m experiments.regression"] + sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
  (workdir / "results.json").write_text(json.dumps(combined, indent=2, default=float))
  return combined


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="cpu", choices=PRESETS)
  parser.add_argument("--algorithms", default="vampire,maml",
                      help="comma-separated, trained in turn (vampire, maml, fomaml, ...)")
  parser.add_argument("--workdir", type=Path, default=None,
                      help="run folder, one sub-folder per algorithm; rerun to resume")
  parser.add_argument("--no-progress", action="store_true")
  # Every RunConfig/RegressionConfig field: --num-meta-steps 500 --kl-weight 0.1 ...
  cli.add_config_flags(parser, RegressionConfig)
  args = parser.parse_args(argv)
  algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
  for algorithm in algorithms:
    if algorithm not in cli.CHOICES["algorithm"]:
      parser.error(f"unknown algorithm {algorithm!r}; choose from {cli.CHOICES['algorithm']}")
  if args.algorithm is not None:
    parser.error("use --algorithms (comma-separated) to choose the methods")
  workdir = args.workdir or Path("runs") / f"regression_{args.preset}_seed{args.seed or 0}"
  return algorithms, args.preset, workdir, args, not args.no_progress


def main(argv=None) -> dict:
  algorithms, preset, workdir, overrides, progress = parse_args(argv)
  print(f"sine/line regression, {preset} preset, methods {algorithms}; workdir {workdir}; "
        f"backend {jax.default_backend()}")
  return run(algorithms, preset, workdir, overrides, progress)


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
