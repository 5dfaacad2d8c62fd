"""Run folders at their edges: a partial newest checkpoint, a network class that no other
process can import, a run resumed under another `JAX_ENABLE_X64`, a loaded step that is not
the tested one, and a pickled `Run`.

Each case is right, or refused in one line that names the argument and the fix. One tiny
regression run (4 meta-steps, checkpoints at 2 and 4) is trained once and copied per test.
"""

import copy
import json
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import vampire_jax as vj
from experiments import cli, regression
from experiments import omniglot as omniglot_experiment
from tests.conftest import (
  OMNIGLOT_DIR,
  REPO,
  needs_omniglot,
  tiny_omniglot_config,
)
from tests.helpers import (
  _checkpoint_params,
  _leaves_equal,
  _one_line_error,
  _tiny_config,
  _truncate_data,
)
from tests.run_folder.conftest import copy_trained as _copy_trained
from tests.run_folder.conftest import load_with_warnings as _load
from tests.run_folder.conftest import predict as _predict
from vampire_jax.runs import reporting, run_folder
from vampire_jax.runs.run_folder import record as run_folder_record

QUIET = dict(progress=False, print_fn=lambda message: None)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  return copy


TINY_FLAGS = [
  "--num-filters",
  "8",
  "--num-inner-steps",
  "1",
  "--tasks-per-step",
  "2",
  "--num-meta-steps",
  "6",
  "--num-val-tasks",
  "4",
  "--num-test-tasks",
  "6",
  "--eval-batch-tasks",
  "3",
  "--eval-every",
  "3",
  "--checkpoint-every",
  "3",
  "--log-every",
  "3",
  "--num-mc-test",
  "2",
]  # conftest's tiny_omniglot_config


REFUSED = [  # (flags, what the one line names: the fields that differ, as the command's flags)
  (["--kl-weight", "0.5"], "--kl-weight: 0.001 -> 0.5"),
  (["--num-filters", "32"], "--num-filters: 8 -> 32"),
  (["--algorithm", "maml"], "--algorithm: 'vampire' -> 'maml'"),
  (["--num-meta-steps", "3"], "--num-meta-steps 3: "),  # fewer steps than trained
]


def _equal(a, b) -> bool:
  """Equal leaves; a NamedTuple (`vj.Gaussian`) compares as the dict a checkpoint saves."""
  a, b = (x._asdict() if hasattr(x, "_asdict") else x for x in (a, b))
  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
    np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b)
  )


def _saved_params(workdir: Path, step: int):
  return run_folder.read_checkpoint(workdir / "checkpoints", step)["meta_params"]


def _one_line(error: pytest.ExceptionInfo) -> str:
  text = str(error.value)
  assert len(text.splitlines()) == 1, text
  return text


def _tree(workdir: Path) -> list[str]:
  return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))


class NarrowMLP(nn.Module):
  """Takes MLP's fields but builds other parameters (a network changed since training)."""

  hidden_sizes: tuple
  num_outputs: int
  kernel_init_gain: float = 1.0

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_outputs)(nn.relu(nn.Dense(3)(x)))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  """Two tiny regression runs of the same config (seeds 0 and 1): `(ours, theirs)`."""
  root = tmp_path_factory.mktemp("identity")
  for name, seed in (("ours", 0), ("theirs", 1)):
    regression.run_experiment(_tiny_config(seed=seed), root / name, **QUIET)
  return root / "ours", root / "theirs"


def _copy_folder(folder: Path, tmp_path: Path) -> Path:
  copy = tmp_path / folder.name
  shutil.copytree(folder, copy)
  return copy


def _rerun(workdir: Path, **changes) -> tuple[dict, list[str]]:
  lines = []
  results = regression.run_experiment(
    _tiny_config(**changes), workdir, progress=False, print_fn=lines.append
  )
  return results, lines


@needs_omniglot
def test_a_damaged_latest_checkpoint_walks_back_and_the_rerun_ends_the_same(
  tiny_omniglot_run, omniglot_cache, tmp_path
):
  straight, config, full = tiny_omniglot_run
  workdir = _copy(straight, tmp_path)
  _truncate_data(workdir / "checkpoints" / "6")
  (workdir / "train_time.json").write_text("")  # as a full disk left it before
  (workdir / "best_score.json").write_text('{"st')
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 9, "train/lo')
  lines = []
  results = omniglot_experiment.run_experiment(
    config, workdir, progress=False, print_fn=lines.append
  )
  said = "\n".join(lines)
  assert (
    "checkpoint 6 in" in said and "does not restore" in said and "trying the next older" in said
  )
  assert "resuming from step 3" in said and results["resumed_from_step"] == 3
  assert [p.name.split("_")[1] for p in (workdir / "damaged").iterdir()] == ["6"]
  # Step 6 again, bit for bit, and the same test.
  assert _leaves_equal(_checkpoint_params(workdir, 6), _checkpoint_params(straight, 6))
  assert results["test"]["accuracy"] == full["test"]["accuracy"]
  assert results["meta_steps"] == 6
  assert reporting.read_metrics(workdir)[-1]["step"] == 6  # the torn line was cut off


@needs_omniglot
@pytest.mark.parametrize("flags, needle", REFUSED, ids=[f[0][0] for f in REFUSED])
def test_without_run_json_another_config_is_refused_from_the_checkpoint(
  flags, needle, tiny_omniglot_run, tmp_path, capsys
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  (workdir / "run.json").unlink()
  argv = [
    "--preset",
    "quick",
    "--workdir",
    str(workdir),
    "--no-compilation-cache",
    "--data-dir",
    str(OMNIGLOT_DIR),
    "--cache-dir",
    tiny_omniglot_run[1].cache_dir,
  ]
  argv += TINY_FLAGS
  before = sorted(p.name for p in workdir.iterdir())
  code = cli.main_entry(omniglot_experiment.main, argv + flags)
  assert code == 2
  _one_line_error(capsys.readouterr().err, needle)
  assert sorted(p.name for p in workdir.iterdir()) == before  # nothing written, run.json too


@needs_omniglot
def test_a_full_disk_at_a_checkpoint_names_it_and_the_intact_one(
  omniglot_cache, tmp_path, monkeypatch
):
  """Simulated: orbax's save of step 6 fails as tensorstore fails on a full disk."""
  save = ocp.CheckpointManager.save

  def full_at_6(self, step, *args, **kwargs):
    if step == 6 and self.directory.name == "checkpoints":
      raise ValueError(
        "RESOURCE_EXHAUSTED: Error writing local file: Failed to write 6051 "
        "bytes to file 8: No space left on device [os_error_code='28']"
      )
    return save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_at_6)
  config = tiny_omniglot_config(omniglot_cache)
  with pytest.raises(vj.StorageError) as error:
    omniglot_experiment.run_experiment(config, tmp_path, **QUIET)
  message = str(error.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith(f"no space left on device writing {tmp_path}/checkpoints/6")
  assert "checkpoint 3 is intact" in message and "free space and run again" in message
  assert not (tmp_path / "results.json").exists()
  monkeypatch.setattr(ocp.CheckpointManager, "save", save)  # space freed
  assert omniglot_experiment.run_experiment(config, tmp_path, **QUIET)["resumed_from_step"] == 3


@needs_omniglot
def test_a_real_full_disk_is_one_line_and_the_rerun_resumes_once_space_is_freed(
  omniglot_cache, tmp_path, capsys
):
  """A 600 kB tmpfs (skipped where mounting is not allowed): room for about one checkpoint."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if (
    subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk)], capture_output=True
    ).returncode
    != 0
  ):
    pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
  try:
    workdir = disk / "run"
    config = tiny_omniglot_config(omniglot_cache, 12)
    run = lambda argv: omniglot_experiment.run_experiment(config, workdir, **QUIET)  # noqa: E731
    assert cli.main_entry(run, ["--no-compilation-cache"]) == 2
    err = capsys.readouterr().err
    _one_line_error(err, "no space left on device writing")
    found = re.search(
      r"writing (\S+)/checkpoints/(\d+) \(checkpoint (\d+) is intact; free "
      r"space and run again\)",
      err,
    )
    assert found and found.group(1) == str(workdir), err
    failed, intact = int(found.group(2)), int(found.group(3))
    assert intact < failed and (workdir / "checkpoints" / str(intact)).is_dir()
    assert not (workdir / "train_time.json").exists() or json.loads(
      (workdir / "train_time.json").read_text()
    )  # never left empty
    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed
    assert cli.main_entry(run, ["--no-compilation-cache"]) == 0
    results = json.loads((workdir / "results.json").read_text())
    assert results["resumed_from_step"] == intact and results["meta_steps"] == 12
  finally:
    subprocess.run(["umount", "--lazy", str(disk)], check=True)  # a failed writer may hold a file


@needs_omniglot
@pytest.mark.parametrize("name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_in_the_test_phase_is_one_line_and_128_plus_its_number(
  name, code, tiny_omniglot_run, tmp_path
):
  workdir = _copy(tiny_omniglot_run[0], tmp_path)
  script = textwrap.dedent(f"""
      import os, signal, sys
      # As in a terminal: a runner that started this in the background (`cmd &`) hands
      # it SIGINT ignored, and Python then leaves Ctrl-C ignored.
      signal.signal(signal.SIGINT, signal.default_int_handler)
      sys.path.insert(0, {str(REPO)!r})
      from tests.conftest import tiny_omniglot_config
      from experiments import cli, omniglot
      from vampire_jax.runs import loop as training
      original = training._test
      def _test(session, *args):  # the signal arrives as the test phase starts
        os.kill(os.getpid(), signal.{name})
        return original(session, *args)
      training._test = _test
      config = tiny_omniglot_config({tiny_omniglot_run[1].cache_dir!r})
      sys.exit(cli.main_entry(lambda argv: omniglot.run_experiment(
          config, {str(workdir)!r}, progress=False), ["--no-compilation-cache"]))
  """)
  out = subprocess.run(
    [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == code, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert (
    lines[-1].startswith(f"{name}: stopped before the run finished")
    and "run the same command again" in lines[-1]
  ), out.stderr
  assert not (workdir / ".lock").read_text()  # the lock was released


def test_an_empty_newest_checkpoint_is_skipped_and_the_newest_complete_one_loads(trained, tmp_path):
  """An empty `checkpoints/400/` is named as incomplete and skipped in one line; step 4, the
  newest complete checkpoint, loads, and the folder is left as it was."""
  workdir = _copy_trained(trained, tmp_path, best=False)
  (workdir / "checkpoints" / "400").mkdir()
  before = _tree(workdir)
  run, said = _load(workdir)
  assert run.step == 4 and _equal(run.meta_params, _saved_params(workdir, 4))
  assert said == [
    f"{workdir / 'checkpoints' / '400'} is incomplete (no default/ folder: an empty folder, or a "
    "copy or sync cut short), not a checkpoint; skipped it, using step 4, the newest complete one"
  ]
  assert _tree(workdir) == before  # a reader moves nothing (a read-only folder loads too)


def test_a_checkpoint_missing_its_default_folder_is_skipped_for_the_one_before(trained, tmp_path):
  """`checkpoints/4/` without `default/` (a copy cut short) is named as incomplete and skipped:
  step 2 loads."""
  workdir = _copy_trained(trained, tmp_path, best=False)
  shutil.rmtree(workdir / "checkpoints" / "4" / "default")
  run, said = _load(workdir)
  assert run.step == 2 and _equal(run.meta_params, _saved_params(workdir, 2))
  assert f"{workdir / 'checkpoints' / '4'} is incomplete" in said[0]
  assert "using step 2, the newest complete one" in said[0]
  assert all(len(line.splitlines()) == 1 for line in said)


def test_a_partial_best_is_skipped_and_the_complete_best_loads(trained, tmp_path):
  """An empty `best/400/` is named as incomplete and skipped: the intact best loads, not the
  latest checkpoint."""
  workdir = _copy_trained(trained, tmp_path)
  best_step = trained[2]["best_validation"]["step"]
  (workdir / "best" / "400").mkdir()
  run, said = _load(workdir)
  assert not any("does not restore" in line for line in said) and run.step == best_step
  assert _equal(run.meta_params, vj.load_run(trained[0]).meta_params)
  assert len(said) == 1 and f"{workdir / 'best' / '400'} is incomplete" in said[0]


def test_an_empty_checkpoint_999_does_not_claim_a_run_trained_to_999_on_resume(trained, tmp_path):
  """Empty `checkpoints/999` and `best/999` do not count as step 999: resuming with
  --num-meta-steps 6 goes on from step 4, and both are named and moved to damaged/."""
  workdir = _copy_trained(trained, tmp_path)
  (workdir / "checkpoints" / "999").mkdir()
  (workdir / "best" / "999").mkdir()
  longer = trained[1].replace(num_meta_steps=6)
  assert run_folder.latest_checkpoint_step(workdir) == 4
  run_folder.check_resumable(workdir, longer)  # no claim of step 999
  lines = []
  results = vj.train_and_evaluate(
    regression.make_problem(longer), longer, workdir, progress=False, print_fn=lines.append
  )
  assert results["resumed_from_step"] == 4 and results["meta_steps"] == 6
  moved = [line for line in lines if "/999 is incomplete" in line]
  assert len(moved) == 2 and all("moved it to" in line for line in moved), lines
  aside = sorted(p.name.split("_")[:2] for p in (workdir / "damaged").iterdir())
  assert aside == [["best", "999"], ["checkpoint", "999"]]
  assert results["best_validation"]["step"] in (2, 4, 6)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "6"]


def test_step_folders_not_named_as_orbax_names_steps_are_not_checkpoints(trained, tmp_path):
  """`checkpoints/0400`, `400.bak` and a file `500` are not steps (orbax never lists them):
  the latest step is 4, the run resumes, and load_run gives step 4 with nothing to report."""
  workdir = _copy_trained(trained, tmp_path, best=False)
  shutil.copytree(workdir / "checkpoints" / "4", workdir / "checkpoints" / "0400")
  shutil.copytree(workdir / "checkpoints" / "4", workdir / "checkpoints" / "400.bak")
  (workdir / "checkpoints" / "500").write_text("a file, not a step")
  assert run_folder.latest_checkpoint_step(workdir) == 4
  run_folder.check_resumable(workdir, trained[1])
  run, said = _load(workdir)
  assert run.step == 4 and said == []


def test_load_run_refuses_a_model_that_is_not_a_network_class_in_one_line(trained):
  """`model=` must be a flax module class, or a module that defines the recorded class."""
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=3)
  assert _one_line(error).startswith("load_run: model is 3; pass the run's network class")
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=vj.MLP((8, 8), 1))
  assert _one_line(error).startswith("load_run: model is an instance of MLP; pass the class")
  with pytest.raises(vj.InputError) as error:
    vj.load_run(trained[0], model=json)
  assert _one_line(error).startswith(
    "load_run: model is the module json, which defines no class MLP"
  )


def test_a_network_with_other_parameters_is_refused_leaving_the_folder_intact(trained, tmp_path):
  """A network of other parameters is refused in one line naming the network, saying the
  folder is intact (never damaged), and the folder is left as it was."""
  workdir = _copy_trained(trained, tmp_path)
  before = _tree(workdir)
  with pytest.raises(vj.RunFolderError) as error:
    vj.load_run(workdir, model=NarrowMLP)
  text = _one_line(error)
  assert "the network built here has other parameters than the checkpoint's" in text
  assert f"The run folder {workdir} is intact" in text and "damaged" not in text
  assert _tree(workdir) == before


def test_load_run_says_which_step_it_loads_when_results_tested_another(trained, tmp_path):
  """With checkpoint 4 deleted, load_run gives step 2's meta-parameters and says in one line
  that results.json's tested step 4 is not the one loaded."""
  workdir = _copy_trained(trained, tmp_path, best=False)
  assert trained[2]["tested_step"] == 4
  intact, said = _load(workdir)
  assert (intact.step, intact.tested_step, said) == (4, 4, [])
  shutil.rmtree(workdir / "checkpoints" / "4")
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (2, 4)
  assert said == [
    f"load_run: {workdir} gives the meta-parameters of step 2 (from checkpoints/), not those of "
    "step 4, which results.json says the test scored: that step's checkpoint is missing or "
    "damaged (Run.step says which step is loaded)"
  ]
  assert _equal(run.meta_params, _saved_params(workdir, 2))


def test_a_results_json_naming_a_step_that_does_not_exist_is_said(trained, tmp_path):
  """A results.json of step 999 (copied from another run, say) is not the loaded step 4."""
  workdir = _copy_trained(trained, tmp_path, best=False)
  path = workdir / "results.json"
  path.write_text(json.dumps(dict(json.loads(path.read_text()), tested_step=999)))
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (4, 999) and len(said) == 1 and "step 999" in said[0]
  path.write_text('{"tested_st')  # damaged: nothing to compare, said as damaged
  run, said = _load(workdir)
  assert (run.step, run.tested_step) == (4, None) and len(said) == 1 and "damaged" in said[0]


def test_a_run_pickles_and_predicts_the_same_without_its_folder(trained, tmp_path):
  """A Run pickles (and deep-copies) and predicts the same numbers without its folder."""
  workdir = _copy_trained(trained, tmp_path)
  run = vj.load_run(workdir)
  expected = _predict(run)
  data = pickle.dumps(run)
  shutil.rmtree(workdir)  # rebuilt from what was pickled, not from the folder
  again = pickle.loads(data)
  assert again.config == run.config and again.record == run.record and again.step == run.step
  assert _equal(again.meta_params, run.meta_params)
  assert np.array_equal(_predict(again), expected)
  assert np.array_equal(_predict(copy.deepcopy(run)), expected)


def test_checkpoints_and_best_carry_the_runs_id_and_step(two_runs):
  ours, theirs = two_runs
  run_id = json.loads((ours / "run.json").read_text())["run_id"]
  assert run_id != json.loads((theirs / "run.json").read_text())["run_id"]
  for folder, step in (("checkpoints", 4), ("checkpoints", 2), ("best", 4)):
    carried = run_folder_record._step_metadata(ours / folder, step)
    assert carried["run_id"] == run_id and carried.get("step", step) == step, (folder, carried)
  assert run_folder_record._step_metadata(ours / "checkpoints", 4)["record"]["run_id"] == run_id


def test_checkpoints_deleted_and_fewer_steps_set_the_old_best_aside(two_runs, tmp_path):
  """A 2-step rerun after the checkpoints are deleted sets the old step-4 best/ aside, naming
  it, and tests its own best (step 2).

  Without results.json, as a run stopped before its first checkpoint leaves it: a finished
  run without checkpoints is refused instead (tests/experiment_scripts/test_omniglot.py)."""
  workdir = _copy_folder(two_runs[0], tmp_path)
  shutil.rmtree(workdir / "checkpoints")
  (workdir / "results.json").unlink()
  results, lines = _rerun(workdir, num_meta_steps=2)
  said = "\n".join(lines)
  assert "holds step 4, ahead of the state this run starts from (step 0)" in said, said
  assert results["meta_steps"] == 2 and results["best_validation"]["step"] == 2
  [aside] = (workdir / "set_aside").iterdir()
  assert aside.name.startswith("best_4_") and (aside / "best_score.json").exists()


def test_another_runs_best_is_refused_in_training_and_by_load_run(two_runs, tmp_path):
  """Another run's best/ copied in is refused by load_run and by training, naming best/4."""
  ours, theirs = two_runs
  workdir = _copy_folder(ours, tmp_path)
  shutil.rmtree(workdir / "best")
  shutil.copytree(theirs / "best", workdir / "best")
  shutil.copy(theirs / "best_score.json", workdir / "best_score.json")
  with pytest.raises(vj.RunFolderError, match=r"best/4 was written by another run"):
    vj.load_run(workdir)
  with pytest.raises(vj.RunFolderError, match=r"best/4 was written by another run"):
    _rerun(workdir, num_meta_steps=6)


def test_another_runs_checkpoint_is_refused(two_runs, tmp_path):
  ours, theirs = two_runs
  workdir = _copy_folder(ours, tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "4")
  shutil.copytree(theirs / "checkpoints" / "4", workdir / "checkpoints" / "4")
  with pytest.raises(vj.RunFolderError, match=r"checkpoints/4 was written by another run"):
    _rerun(workdir, num_meta_steps=6)


def test_a_renamed_checkpoint_is_refused(two_runs, tmp_path):
  workdir = _copy_folder(two_runs[0], tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "4")
  (workdir / "checkpoints" / "2").rename(workdir / "checkpoints" / "4")
  with pytest.raises(vj.RunFolderError, match=r"checkpoints/4 carries the state of step 2"):
    _rerun(workdir, num_meta_steps=6)


def test_a_reader_reads_the_best_a_writer_just_replaced(two_runs, tmp_path):
  """A reader whose manager still lists best step 4 reads the best a writer just replaced."""
  workdir = _copy_folder(two_runs[0], tmp_path)
  reader = run_folder.RunCheckpoints(workdir, create=False, print_fn=pytest.fail)
  writer = run_folder.RunCheckpoints(workdir, record=json.loads((workdir / "run.json").read_text()))
  template = reader.restore_best(vj.load_run(workdir).meta_params)  # step 4, read once
  newer = jax.tree_util.tree_map(lambda x: x + 1.0, template)
  writer.save_best(newer, {"step": 6, "score": 0.1, "metric": "mse"}, write_files=True)
  writer.close()
  got = reader.restore_best(template)  # the reader's manager still lists step 4
  reader.close()
  assert all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(newer))
  )


def test_a_resumed_run_is_unchanged(two_runs, tmp_path):
  """The identity checks accept the run's own folder: a longer rerun resumes from step 4."""
  workdir = _copy_folder(two_runs[0], tmp_path)
  results, lines = _rerun(workdir, num_meta_steps=6)
  assert results["resumed_from_step"] == 4 and results["meta_steps"] == 6
  assert not any("another run" in line or "set aside" in line for line in lines), lines


def test_load_run_on_a_comparison_names_the_runs_inside(two_runs):
  root = two_runs[0].parent
  with pytest.raises(vj.MissingDataError) as error:
    vj.load_run(root)
  message = str(error.value)
  assert len(message.splitlines()) == 1, message
  assert message.startswith(f"{root} is not a run folder")  # the folder and the cause
  assert "holds 2 runs (a comparison)" in message
  assert f"{root / 'ours'}, {root / 'theirs'}" in message and "load one of them" in message
