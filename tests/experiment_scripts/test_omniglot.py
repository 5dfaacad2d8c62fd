"""experiments.omniglot end to end: the quick run learns, an interrupted run resumes
bit-identically (after a kill or a SIGTERM), and a finished run loads back."""

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, omniglot, zoo
from tests.conftest import needs_omniglot, tiny_omniglot_config
from vampire_jax.runs import run_folder

QUIET = dict(progress=False, print_fn=lambda message: None)


REPO = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> dict:
  return {
    p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(folder.rglob("*"))
    if p.is_file()
  }


@pytest.fixture(scope="module")
def copied_cell(tiny_omniglot_run, tmp_path_factory):
  """The suite's tiny finished run put in a zoo of its own (`best/<step>`, no checkpoints):
  `(the cell, the run's config, its best step)`."""
  workdir, config, results = tiny_omniglot_run
  zoo_folder = tmp_path_factory.mktemp("zoo")
  name = zoo.add_run(workdir, zoo_folder, name="tiny_cell")
  step = results["best_validation"]["step"]
  assert zoo.read_manifest(zoo_folder)["cells"][name]["checkpoint"] == f"best/{step}"
  return zoo_folder / name, config, step


def _copy(cell: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "mine"
  shutil.copytree(cell, copy)
  assert run_folder.latest_checkpoint_step(copy) is None
  return copy


pytestmark = needs_omniglot


def _final_state(workdir):
  return run_folder.read_checkpoint(Path(workdir) / "checkpoints")


def _assert_same_state(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@needs_omniglot
def test_a_copied_cell_with_more_steps_is_refused_naming_the_difference(copied_cell, tmp_path):
  cell, config, step = copied_cell
  copy = _copy(cell, tmp_path)
  before = _files(copy)
  with pytest.raises(vj.ConfigError) as refused:
    omniglot.run_experiment(config.replace(num_meta_steps=8), copy, **QUIET)
  message = str(refused.value)
  assert message.startswith(
    f"{copy} holds a finished run (results.json, its best/ of step {step}) but no checkpoint "
    "to resume it from (a zoo cell keeps only its tested meta-parameters), and its settings "
    "differ from this command's (num_meta_steps: 6 -> 8): training here would start again "
    "at step 0 over it. "
  )
  assert f"pass init_from={str(copy)!r} with another workdir" in message
  assert message.endswith("to train anew, use another workdir")
  assert len(message.splitlines()) == 1 and "--" not in message
  assert _files(copy) == before  # nothing moved aside, nothing written


@needs_omniglot
def test_the_same_settings_are_refused_too(copied_cell, tmp_path):
  cell, config, _ = copied_cell
  copy = _copy(cell, tmp_path)
  with pytest.raises(vj.ConfigError, match=r"and its settings are this command's \(load it"):
    omniglot.run_experiment(config, copy, **QUIET)
  assert not (copy / run_folder.SET_ASIDE_FOLDER).exists()


def test_the_issues_command_on_a_copy_of_the_zoo_cell_exits_2_in_one_line(tmp_path, capsys):
  copy = _copy(REPO / "zoo" / "omniglot_original_quick_vampire", tmp_path)
  before = _files(copy)
  argv = ["--preset", "quick", "--workdir", str(copy), "--num-meta-steps", "240"]
  assert cli.main_entry(omniglot.main, argv + ["--no-compilation-cache"]) == 2
  said = capsys.readouterr()
  (line,) = [line for line in said.err.splitlines() if line.startswith("error:")]
  assert "holds a finished run (results.json, its best/ of step 200)" in line
  assert "num_meta_steps: 200 -> 240" in line
  # The library's fields, said as the command line's flags.
  assert f"pass --init-from={str(copy)!r} with another --workdir" in line
  assert line.endswith("to train anew, use another --workdir")
  assert "Traceback" not in said.out + said.err and _files(copy) == before


@pytest.mark.slow  # a run that must learn: minutes
def test_quick_maml_run_learns(omniglot_cache, tmp_path):
  config = omniglot.get_config("quick", "maml").replace(
    num_meta_steps=150,
    num_test_tasks=100,
    eval_every=150,
    checkpoint_every=150,
    cache_dir=str(omniglot_cache),
  )
  results = omniglot.run_experiment(config, tmp_path, progress=False)
  # Chance is 20 %; 150 meta-steps of 8 tasks on Conv4-16 reach about 55-60 % here.
  assert results["test"]["accuracy"] > 0.45, results["test"]
  for name in (
    "results.json",
    "reliability.png",
    "risk_coverage.png",
    "training_curves.png",
    "split.json",
    "metrics.jsonl",
    "run.json",
  ):
    assert (tmp_path / name).stat().st_size > 0, name
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["config"]["algorithm"]["name"] == "maml" and saved["git_commit"]
  # The data's source is on record.
  assert saved["data"]["source"] == "zip" and saved["data"]["split"] == "original"
  # Selective prediction: the most confident half is more accurate than all.
  assert saved["test"]["accuracy_at_50_coverage"] > saved["test"]["accuracy"]


def test_interrupted_run_resumes_to_the_same_result(omniglot_cache, tiny_omniglot_run, tmp_path):
  straight, full = tiny_omniglot_run[0], tiny_omniglot_run[2]
  quiet = dict(progress=False, print_fn=lambda message: None)
  # Stopped after 3 steps (as a kill -9 after the step-3 checkpoint leaves it), then resumed.
  omniglot.run_experiment(tiny_omniglot_config(omniglot_cache, 3), tmp_path, **quiet)
  resumed = omniglot.run_experiment(tiny_omniglot_config(omniglot_cache, 6), tmp_path, **quiet)
  assert resumed["resumed_from_step"] == 3
  assert int(_final_state(tmp_path)["step"]) == 6
  _assert_same_state(_final_state(straight), _final_state(tmp_path))
  assert resumed["test"]["accuracy"] == full["test"]["accuracy"]


def test_sigterm_saves_a_checkpoint_and_the_rerun_finishes_the_same(
  omniglot_cache, tiny_omniglot_run, tmp_path
):
  config = tiny_omniglot_config(omniglot_cache, log_every=1, checkpoint_every=6)

  def terminate_at_step_2(message):  # the loop prints a line per logged step
    if message.startswith("step 2/"):
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(vj.TrainingInterrupted) as stop:
    omniglot.run_experiment(config, tmp_path, print_fn=terminate_at_step_2)
  assert stop.value.step == 2 and stop.value.signum == signal.SIGTERM
  assert "run the same command again to resume" in str(stop.value)
  assert int(_final_state(tmp_path)["step"]) == 2  # saved, though checkpoint_every is 6
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
  resumed = omniglot.run_experiment(config, tmp_path, progress=False)
  assert resumed["resumed_from_step"] == 2
  _assert_same_state(_final_state(tiny_omniglot_run[0]), _final_state(tmp_path))


def test_cli_presets_and_overrides(tmp_path):
  config, workdir, args = omniglot.parse_args(
    [
      "--preset",
      "20way5shot",
      "--algorithm",
      "maml",
      "--split",
      "random",
      "--workdir",
      str(tmp_path),
    ]
  )
  assert (config.ways, config.shots, config.schedule.tasks_per_step) == (20, 5, 16)
  assert "kl_weight" not in config.flat()  # MAML has no KL term
  assert config.split == "random" and workdir == tmp_path and not args.no_progress
  config, _, _ = omniglot.parse_args(
    [
      "--kl-weight",
      "0.05",
      "--log-std-init",
      "-5",
      "-4",
      "--meta-grad-clip-norm",
      "0",
      "--first-order",
      "--class-sampling",
      "class",
      "--no-batch-norm-affine",
    ]
  )
  assert config.algorithm.kl_weight == 0.05 and config.algorithm.log_std_init == (-5.0, -4.0)
  assert config.schedule.meta_grad_clip_norm is None and config.algorithm.first_order
  assert config.class_sampling == "class" and not config.batch_norm_affine
  vampire = omniglot.get_config("5way1shot", "vampire")
  spec = vampire.algorithm
  assert (spec.inner_lr, spec.kl_weight, spec.num_mc_test) == (0.01, 0.1, 10)
  assert vampire.class_sampling == "character" and vampire.batch_norm_affine
  with pytest.raises(SystemExit):
    omniglot.parse_args(["--algorithm", "bogus"])


def test_authors_batch_norm_has_no_scale_or_offset():
  with_affine = vj.init_params(vj.Conv4(5, num_filters=4), jax.random.key(0), (1, 28, 28, 1))
  without = vj.init_params(
    vj.Conv4(5, num_filters=4, batch_norm_affine=False), jax.random.key(0), (1, 28, 28, 1)
  )
  assert set(with_affine["norm0"]) == {"scale", "offset"} and "norm0" not in without
  size = lambda tree: sum(x.size for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
  assert size(with_affine) - size(without) == 4 * 2 * 4  # 4 blocks x (scale, offset) x 4 filters
