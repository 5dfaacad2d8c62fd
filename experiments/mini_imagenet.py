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
writes calibration.json (accuracy +- 95% CI, NLL, ECE, MCE) and
calibration_reliability.png.
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import vampire_jax as vj
from experiments import calibration_protocol, cli, runner
from vampire_jax import data

PRESETS = ("5way1shot", "5way5shot", "quick")


@dataclasses.dataclass
class MiniImagenetConfig(runner.RunConfig):
  ways: int = 5
  shots: int = 1
  query: int = 15
  num_filters: int = 32
  conv_impl: str = "xla"
  image_size: int = 84             # 84 in the paper; smaller only for fast tests
  data_dir: Optional[str] = None   # default: env MINI_IMAGENET_DIR
  cache_dir: Optional[str] = None  # default: env VAMPIRE_JAX_CACHE, else ~/.cache/vampire_jax
  source: str = "auto"             # see data.load_mini_imagenet
  existing_only: bool = False      # use only the images present (partial copies)


def get_config(preset: str = "5way1shot", algorithm: str = "vampire") -> MiniImagenetConfig:
  """The paper's mini-ImageNet settings (PAPER_NOTES.md, hyper-parameter table).

  Presets: 5way1shot, 5way5shot (paper: T = 2, L_t = L_v = 10, inner lr
  0.01, 5 inner steps, KL weight 0.1, 600 test tasks), quick (CPU smoke run
  that fits the 12-image sample: 5 query images per class, KL weight 0.001).
  """
  if preset in ("5way1shot", "5way5shot"):
    # The paper gives no training length; 60 000 steps of T = 2 are 120 000
    # tasks (MAML trained 60 000 steps of 4 tasks). See BUILD_NOTES.md.
    config = MiniImagenetConfig(
        shots=int(preset[4]), tasks_per_step=2, num_meta_steps=60_000, inner_lr=0.01,
        num_mc_train=10, num_mc_query=10, num_mc_test=10, num_val_tasks=200,
        num_test_tasks=600, eval_batch_tasks=10, eval_every=2000, checkpoint_every=2000,
        log_every=100)
  elif preset == "quick":
    # A smoke run of a few minutes on a 2-core CPU that fits the sample
    # (12 images per class): 1 support + 5 query images per class, 120
    # tasks, one validation, 40 test tasks. Far too short to learn
    # mini-ImageNet: expect about chance (20 %).
    config = MiniImagenetConfig(
        shots=1, query=5, tasks_per_step=2, num_meta_steps=60, inner_lr=0.01,
        num_val_tasks=8, num_test_tasks=40, eval_batch_tasks=2, eval_every=60,
        checkpoint_every=60, log_every=10, num_mc_test=2, chunk_size=2, existing_only=True)
  else:
    raise ValueError(f"unknown preset {preset!r}; expected one of {PRESETS}")
  if cli.set_algorithm(config, algorithm) and preset == "quick":
    # As Omniglot's quick preset: KL weight 0.001 keeps the inner loop stable
    # (inner_lr * kl_weight / sigma_p^2 is 3 at the paper's 0.1; BUILD_NOTES.md).
    config.kl_weight = 0.001
  return config


def load_splits(config: MiniImagenetConfig) -> dict[str, data.MiniImagenetSplit]:
  """The three splits, resized to `config.image_size` if it is not 84."""
  splits = data.load_mini_imagenet(config.data_dir or os.environ.get("MINI_IMAGENET_DIR"),
                                   cache_dir=config.cache_dir, source=config.source,
                                   existing_only=config.existing_only)
  if config.image_size != data.mini_imagenet.IMAGE_SIZE:
    splits = {name: split._replace(images=_resize(split.images, config.image_size))
              for name, split in splits.items()}
  return splits


def make_problem(config: MiniImagenetConfig, workdir: Optional[Path] = None,
                 splits: Optional[dict[str, data.MiniImagenetSplit]] = None) -> runner.Problem:
  """Loads mini-ImageNet (unless `splits` is given) and puts it on the device."""
  splits = splits or load_splits(config)
  for split in splits.values():
    data.check_episode_spec(len(split.wnids), split.images.shape[1], ways=config.ways,
                            shots=config.shots, query=config.query)
  if workdir is not None:
    record = {name: {"num_classes": len(split.wnids), "images_per_class": split.images.shape[1],
                     "wnids": split.wnids.tolist()} for name, split in splits.items()}
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "split.json").write_text(json.dumps(record, indent=1))
  device_images = {name: jax.device_put(split.images) for name, split in splits.items()}

  def sample_tasks(split, key, num_tasks):
    return data.sample_tasks(key, device_images[split], num_tasks=num_tasks, ways=config.ways,
                             shots=config.shots, query=config.query, rotate=False)

  model = vj.Conv4(num_classes=config.ways, num_filters=config.num_filters, max_pool=True,
                   conv_impl=config.conv_impl)
  input_shape = (1, config.image_size, config.image_size, 3)
  return runner.Problem(
      apply_fn=vj.pure_apply(model),
      init_params=lambda key: vj.init_params(model, key, input_shape),
      nll=vj.categorical_nll, sample_tasks=sample_tasks, kind="classification")


def _resize(images: np.ndarray, size: int) -> np.ndarray:
  """uint8 `[C, E, 84, 84, 3]` -> `[C, E, size, size, 3]` (bilinear, antialiased)."""
  shape = images.shape[:2] + (size, size, 3)
  resized = jax.image.resize(jnp.asarray(images, jnp.float32), shape, "linear")
  return np.asarray(jnp.clip(jnp.round(resized), 0, 255)).astype(np.uint8)


def default_workdir(config: MiniImagenetConfig, preset: str) -> Path:
  return Path("runs") / f"mini_imagenet_{preset}_{config.algorithm}_seed{config.seed}"


def parse_args(argv=None) -> tuple[MiniImagenetConfig, Path, bool, argparse.Namespace]:
  return cli.parse_experiment_args(
      argv, __doc__, MiniImagenetConfig, PRESETS, get_config, default_workdir,
      add_flags=calibration_protocol.add_flags,
      choices={"source": list(data.mini_imagenet.SOURCES)})


def main(argv=None) -> dict:
  config, workdir, progress, args = parse_args(argv)
  print(f"mini-ImageNet {config.ways}-way {config.shots}-shot, {config.algorithm}; "
        f"workdir {workdir}; backend {jax.default_backend()}")
  splits = load_splits(config)
  problem = make_problem(config, workdir, splits)
  return calibration_protocol.run_experiment(problem, config, workdir, args,
                                             jax.device_put(splits["test"].images),
                                             progress=progress)


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
