"""mini-ImageNet 5-way: VAMPIRE or MAML with Conv4-32 + max-pool, the paper's Table 2 and Fig. 4.

    python -m experiments.mini_imagenet --preset quick \\
        --data-dir ../shared/data/mini_imagenet_sample   # CPU smoke run on the 12-image sample
    python -m experiments.mini_imagenet --preset 5way1shot --algorithm vampire \\
        --data-dir /data/mini_imagenet --calibration-tasks all
    python -m experiments.mini_imagenet --preset 5way1shot --workdir runs/x \\
        --calibration-only --calibration-tasks 2000     # re-score a trained run

Data: `--data-dir` (or env MINI_IMAGENET_DIR) is a folder in Ravi &
Larochelle's layout (`images/*.jpg` + `split/{train,val,test}.csv`) or with
the pickle caches `mini-imagenet-cache-{train,val,test}.pkl`; see
`vampire_jax.data.load_mini_imagenet`. The 84x84 arrays are cached (1.3 GB,
`--cache-dir` / VAMPIRE_JAX_CACHE), so a GPU machine can be given just the
cache. `--existing-only` uses the images present and the smallest class's
count per split (for partial copies; `quick` sets it).

Splits: Ravi & Larochelle's 64 / 16 / 20 classes for meta-train / validation
/ test. The run writes the classes of each split to `split.json`.

Calibration (paper Fig. 4): `--calibration-tasks all` scores the final model
on every 5-class combination of the 20 test classes, C(20, 5) = 15 504 tasks,
with 15 query images per class; a number N scores a random subset of N. It
writes calibration.json (accuracy +- 95% CI, NLL, ECE, MCE, AURC) and
calibration_reliability.png.
"""

import json
import os
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import calibration_protocol, cli, train
from experiments.presets import MINI_IMAGENET_PRESETS as PRESETS
from experiments.presets import MiniImagenetConfig
from experiments.presets import mini_imagenet_config as get_config
from vampire_jax import data
from vampire_jax import backend
from vampire_jax.runs import algorithms, kinds
from vampire_jax.runs import experiment_configs as configs


def load_splits(config: MiniImagenetConfig) -> dict[str, data.MiniImagenetSplit]:
  """The three splits, resized to `config.image_size` if it is not 84."""
  splits = data.load_mini_imagenet(
    config.data_dir or os.environ.get("MINI_IMAGENET_DIR"),
    cache_dir=config.cache_dir,
    source=config.source,
    existing_only=config.existing_only,
  )
  if config.image_size != data.mini_imagenet.IMAGE_SIZE:
    splits = {
      name: split._replace(images=_resize(split.images, config.image_size))
      for name, split in splits.items()
    }
  return splits


class ImageSplit(NamedTuple):
  """What a split's tasks are drawn from (the `data` of its sampler)."""

  images: jax.Array  # uint8 [classes, images, H, W, 3]
  query_slots: jax.Array  # [query, 0]: its shape holds the query images per class (static)

  @property
  def query(self) -> int:
    return self.query_slots.shape[0]


def make_problem(
  config: MiniImagenetConfig,
  workdir: Optional[Path] = None,
  splits: Optional[dict[str, data.MiniImagenetSplit]] = None,
) -> vj.Problem:
  """Loads mini-ImageNet (unless `splits` is given) and puts it on the device."""
  splits = splits or load_splits(config)
  query = {name: configs.test_query(config) if name == "test" else config.query for name in splits}
  train_ways = config.algorithm.training_ways(config.ways)  # ProtoNet's --train-ways, else --ways
  for name, split in splits.items():  # partial copies: the images actually present
    data.check_episode_spec(
      len(split.wnids),
      split.images.shape[1],
      ways=train_ways if name == "train" else config.ways,
      shots=config.shots,
      query=query[name],
    )
  if workdir is not None:
    record = {
      name: {
        "num_classes": len(split.wnids),
        "images_per_class": split.images.shape[1],
        "wnids": split.wnids.tolist(),
      }
      for name, split in splits.items()
    }
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "split.json").write_text(json.dumps(record, indent=1))

  episode = dict(ways=config.ways, shots=config.shots, rotate=False)
  num_unknown = configs.open_set_classes(config, len(splits["test"].wnids))

  def sample_tasks(split: ImageSplit, task_keys):
    return data.tasks_from_keys(task_keys, split.images, **episode, query=split.query)

  def sample_train_tasks(split: ImageSplit, task_keys):
    episode_ways = dict(episode, ways=train_ways)
    return data.tasks_from_keys(task_keys, split.images, **episode_ways, query=split.query)

  def sample_open_set_tasks(split: ImageSplit, task_keys):
    return data.open_set_tasks_from_keys(
      task_keys, split.images, **episode, query=split.query, num_unknown=num_unknown
    )

  model = vj.Conv4(
    num_classes=algorithms.network_outputs(config),
    num_filters=config.num_filters,
    max_pool=True,
    conv_impl=backend.config_conv_impl(config),
    batch_norm_affine=config.batch_norm_affine,
    batch_norm_epsilon=config.batch_norm_epsilon,
    kernel_init_gain=config.kernel_init_gain,
  )
  folder = config.data_dir or os.environ.get("MINI_IMAGENET_DIR")
  return vj.Problem(
    model=model,
    input_shape=(config.image_size, config.image_size, 3),
    splits={
      name: ImageSplit(jax.device_put(split.images), jnp.zeros((query[name], 0), jnp.uint8))
      for name, split in splits.items()
    },
    sample_tasks=sample_tasks,
    kind="classification",
    data_info={
      "dataset": "mini_imagenet",
      "source": config.source,
      "folder": None if folder is None else str(Path(folder).resolve()),
    },
    sample_open_set_tasks=sample_open_set_tasks if num_unknown else None,
    sample_train_tasks=sample_train_tasks if train_ways != config.ways else None,
  )


def _resize(images: np.ndarray, size: int) -> np.ndarray:
  """uint8 `[C, E, 84, 84, 3]` -> `[C, E, size, size, 3]` (bilinear, antialiased)."""
  shape = images.shape[:2] + (size, size, 3)
  resized = jax.image.resize(jnp.asarray(images, jnp.float32), shape, "linear")
  return np.asarray(jnp.clip(jnp.round(resized), 0, 255)).astype(np.uint8)


def default_workdir(config: MiniImagenetConfig, preset: str) -> Path:
  return Path("runs") / f"mini_imagenet_{preset}_{config.algorithm.name}_seed{config.seed}"


def run_experiment(
  config: MiniImagenetConfig,
  workdir: Path,
  *,
  progress: bool = True,
  splits=None,
  print_fn=print,
  init_from=None,
) -> dict:
  """Checks the config, loads the data, meta-trains, tests and draws the figures."""
  return train.run_experiment(
    config,
    workdir,
    lambda: make_problem(config, workdir, splits),
    progress=progress,
    print_fn=print_fn,
    init_from=init_from,
  )


def parse_args(argv=None):
  """`(config, workdir, args)` from the command line (flags as `--help` lists them)."""
  config, args = cli.parse(
    argv, __doc__, PRESETS, get_config, add_flags=calibration_protocol.add_flags
  )
  return config, args.workdir or default_workdir(config, args.preset), args


def main(argv=None) -> dict:
  config, workdir, args = parse_args(argv)
  print(
    f"mini-ImageNet {config.ways}-way {config.shots}-shot, {config.algorithm.name}; "
    f"workdir {workdir}; backend {jax.default_backend()}"
  )
  algorithms.check_config(config)
  splits = load_splits(config)
  results = {}
  if not args.calibration_only:
    results = run_experiment(
      config, workdir, progress=not args.no_progress, splits=splits, init_from=args.init_from
    )
    print(kinds.test_summary_line(results["test"], results["kind"]))
  calibration = calibration_protocol.run_protocol(
    workdir, args, jax.device_put(splits["test"].images)
  )
  if calibration is not None:
    results["calibration_protocol"] = calibration
  return results


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
