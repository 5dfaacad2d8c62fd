"""Omniglot N-way k-shot, the paper's Table 1: VAMPIRE, MAML or a baseline.

    OMNIGLOT_DIR=../shared/data/omniglot python -m experiments.omniglot --preset quick
    python -m experiments.omniglot --preset 5way1shot --algorithm vampire --split original
    python -m experiments.omniglot --preset 20way5shot --algorithm maml --split random

Data: `--data-dir` (or env OMNIGLOT_DIR) is a folder with Omniglot's
`images_background.zip` and `images_evaluation.zip`, read directly (no
TensorFlow needed); without a folder, TFDS downloads Omniglot
(`pip install -e ".[data]"`). The 28x28 arrays are cached (25 MB,
`--cache-dir` / VAMPIRE_JAX_CACHE), so later runs, or a GPU machine given
only the cache, skip the build.

Classes: a character rotated by 0/90/180/270 degrees is a class of its own.
By default a task draws N distinct characters, each at a random rotation
(MAML's protocol); `--class-sampling class` draws N distinct (character,
rotation) pairs. Splits: `original` trains on the background set and tests
on the 659 evaluation characters; `random` draws 1200 characters with a
fixed seed for training and tests on the other 423. By default 5 held-out
background alphabets (151 characters, `--num-val-alphabets`) or 100 of the
1200 (`--num-val-characters`) validate; the paper presets set both to 0, the
paper's training sets (all 964, or all 1200, characters train, and validation
draws its tasks from them). The run writes the characters of each part to
`split.json`.

Open-set test (`--num-open-set-classes`, default as many as `--ways`): each
test episode also gets queries of unknown evaluation characters;
results.json's `test.open_set` holds the AUROCs of telling them apart.
"""

import os
import sys
from pathlib import Path
from typing import Optional

import jax

import vampire_jax as vj
from experiments import cli, train
from experiments.presets import OMNIGLOT_PRESETS as PRESETS
from experiments.presets import OmniglotConfig
from experiments.presets import omniglot_config as get_config
from vampire_jax import data
from vampire_jax import backend
from vampire_jax.runs import experiment_configs as configs
from vampire_jax.runs import algorithms, kinds

INPUT_SHAPE = (28, 28, 1)


def load_data(config: OmniglotConfig, print_fn=print) -> data.OmniglotArrays:
  """All of Omniglot at 28x28: the cache, or built from the zips (or TFDS)."""
  return data.load_omniglot(
    config.data_dir or os.environ.get("OMNIGLOT_DIR") or None,
    cache_dir=config.cache_dir,
    source=config.data_source,
    print_fn=print_fn,
  )


def make_problem(
  config: OmniglotConfig,
  workdir: Optional[Path] = None,
  arrays: Optional[data.OmniglotArrays] = None,
  print_fn=print,
) -> vj.Problem:
  """Loads Omniglot (unless `arrays` is given), splits it, puts the splits on the device."""
  arrays = arrays if arrays is not None else load_data(config, print_fn)
  sizes = dict(
    seed=config.split_seed,
    num_val_alphabets=config.num_val_alphabets,
    num_val_characters=config.num_val_characters,
  )
  splits = data.make_split(arrays, config.split, **sizes)
  if workdir is not None:
    data.save_split_indices(Path(workdir) / "split.json", arrays, config.split, **sizes)
  episode = dict(
    ways=config.ways,
    shots=config.shots,
    query=config.query,
    rotate=True,
    class_sampling=config.class_sampling,
  )

  def sample_tasks(images, task_keys):
    return data.tasks_from_keys(task_keys, images, **episode)

  def sample_train_tasks(images, task_keys):  # ProtoNet's --train-ways
    return data.tasks_from_keys(
      task_keys, images, **dict(episode, ways=config.algorithm.training_ways(config.ways))
    )

  def sample_open_set_tasks(images, task_keys):
    return data.open_set_tasks_from_keys(
      task_keys, images, **episode, num_unknown=configs.open_set_classes(config)
    )

  model = vj.Conv4(
    num_classes=algorithms.network_outputs(config),
    num_filters=config.num_filters,
    conv_impl=backend.config_conv_impl(config),
    batch_norm_affine=config.batch_norm_affine,
    batch_norm_epsilon=config.batch_norm_epsilon,
    kernel_init_gain=config.kernel_init_gain,
    padding=config.conv_padding,
  )
  return vj.Problem(
    model=model,
    input_shape=INPUT_SHAPE,
    splits={name: jax.device_put(images) for name, images in splits.items()},
    sample_tasks=sample_tasks,
    kind="classification",
    data_info=dict(arrays.provenance, split=config.split),
    sample_open_set_tasks=(sample_open_set_tasks if configs.open_set_classes(config) else None),
    sample_train_tasks=(
      sample_train_tasks if config.algorithm.training_ways(config.ways) != config.ways else None
    ),
  )


def default_workdir(config: OmniglotConfig, preset: str) -> Path:
  return (
    Path("runs") / f"omniglot_{preset}_{config.algorithm.name}_{config.split}_seed{config.seed}"
  )


def run_experiment(
  config: OmniglotConfig, workdir: Path, *, progress: bool = True, print_fn=print, init_from=None
) -> dict:
  """Checks the config, loads the data, meta-trains, tests and draws the figures."""
  return train.run_experiment(
    config,
    workdir,
    lambda: make_problem(config, workdir, print_fn=print_fn),
    progress=progress,
    print_fn=print_fn,
    init_from=init_from,
  )


def parse_args(argv=None):
  """`(config, workdir, args)` from the command line (flags as `--help` lists them)."""
  config, args = cli.parse(argv, __doc__, PRESETS, get_config)
  return config, args.workdir or default_workdir(config, args.preset), args


def main(argv=None) -> dict:
  config, workdir, args = parse_args(argv)
  print(
    f"Omniglot {config.ways}-way {config.shots}-shot, {config.algorithm.name}, split "
    f"{config.split}; workdir {workdir}; backend {jax.default_backend()}"
  )
  results = run_experiment(config, workdir, progress=not args.no_progress, init_from=args.init_from)
  print(kinds.test_summary_line(results["test"], results["kind"]))
  print(f"results: {workdir / 'results.json'}; figures: {', '.join(results['plots'].values())}")
  return results


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
