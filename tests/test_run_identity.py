"""A run reads only what it wrote.

Checkpoints and `best/` carry the run's id and step; a foreign or stale one is
refused (or, for a `best/` ahead of the state training starts from, set aside)
in one line. Caches look at their source. `paper_table` fills a cell only with
a run of the paper's settings.
"""

import json
import shutil
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

import vampire_jax as vj
from conftest import tiny_regression_config
from experiments import cli, presets, mini_imagenet, omniglot, paper_table, regression
from vampire_jax.runs import config_records, run_folder
from vampire_jax.runs.run_folder import record as run_folder_record
from vampire_jax.data import mini_imagenet as mi
from vampire_jax.data import mini_imagenet_files

QUIET = dict(progress=False, print_fn=lambda message: None)


def _tiny_config(**changes):
  return tiny_regression_config(**{"num_meta_steps": 4, "num_mc_test": 2, **changes})


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  """Two tiny regression runs of the same config (seeds 0 and 1): `(ours, theirs)`."""
  root = tmp_path_factory.mktemp("identity")
  for name, seed in (("ours", 0), ("theirs", 1)):
    regression.run_experiment(_tiny_config(seed=seed), root / name, **QUIET)
  return root / "ours", root / "theirs"


def _copy(folder: Path, tmp_path: Path) -> Path:
  copy = tmp_path / folder.name
  shutil.copytree(folder, copy)
  return copy


def _rerun(workdir: Path, **changes) -> tuple[dict, list[str]]:
  lines = []
  results = regression.run_experiment(
    _tiny_config(**changes), workdir, progress=False, print_fn=lines.append
  )
  return results, lines


# -- Checkpoints and best/ carry the run's identity ------------------------------------------


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
  run without checkpoints is refused instead (tests/test_no_silent_restart.py)."""
  workdir = _copy(two_runs[0], tmp_path)
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
  workdir = _copy(ours, tmp_path)
  shutil.rmtree(workdir / "best")
  shutil.copytree(theirs / "best", workdir / "best")
  shutil.copy(theirs / "best_score.json", workdir / "best_score.json")
  with pytest.raises(vj.RunFolderError, match=r"best/4 was written by another run"):
    vj.load_run(workdir)
  with pytest.raises(vj.RunFolderError, match=r"best/4 was written by another run"):
    _rerun(workdir, num_meta_steps=6)


def test_another_runs_checkpoint_is_refused(two_runs, tmp_path):
  ours, theirs = two_runs
  workdir = _copy(ours, tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "4")
  shutil.copytree(theirs / "checkpoints" / "4", workdir / "checkpoints" / "4")
  with pytest.raises(vj.RunFolderError, match=r"checkpoints/4 was written by another run"):
    _rerun(workdir, num_meta_steps=6)


def test_a_renamed_checkpoint_is_refused(two_runs, tmp_path):
  workdir = _copy(two_runs[0], tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "4")
  (workdir / "checkpoints" / "2").rename(workdir / "checkpoints" / "4")
  with pytest.raises(vj.RunFolderError, match=r"checkpoints/4 carries the state of step 2"):
    _rerun(workdir, num_meta_steps=6)


def test_a_reader_reads_the_best_a_writer_just_replaced(two_runs, tmp_path):
  """A reader whose manager still lists best step 4 reads the best a writer just replaced."""
  workdir = _copy(two_runs[0], tmp_path)
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
  workdir = _copy(two_runs[0], tmp_path)
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


# -- Caches look at their source ----------------------------------------------------------------


def _fake_mini_imagenet(root: Path, per_class: int = 2, csv_text=None) -> Path:
  """A tiny folder in Ravi & Larochelle's layout: 2 classes per split, `per_class` images each."""
  (root / "images").mkdir(parents=True)
  (root / "split").mkdir()
  rng = np.random.default_rng(0)
  for s, split in enumerate(("train", "val", "test")):
    rows = ["filename,label"]
    for c in range(2):
      wnid = f"n{s}{c:07d}"
      for i in range(per_class):
        name = f"{wnid}{i:08d}.png"
        Image.fromarray(rng.integers(0, 255, (84, 84, 3), dtype=np.uint8)).save(
          root / "images" / name
        )
        rows.append(f"{name},{wnid}")
    text = "\n".join(rows) + "\n"
    (root / "split" / f"{split}.csv").write_text(csv_text(text) if csv_text else text)
  return root


def _load(folder, cache, **kwargs):
  return vj.data.load_mini_imagenet(folder, cache_dir=cache, existing_only=True, **kwargs)


def test_the_mini_imagenet_cache_is_rebuilt_when_an_image_changes(tmp_path, capsys):
  """A changed image makes the cache rebuild, saying so: the new image, not the cached one."""
  folder = _fake_mini_imagenet(tmp_path / "mini")
  first = _load(folder, tmp_path / "cache")
  assert first["train"].images[0, 0].max() > 0
  Image.fromarray(np.zeros((84, 84, 3), np.uint8)).save(folder / "images" / _first_image())
  capsys.readouterr()
  second = _load(folder, tmp_path / "cache")
  assert "rebuilding the cache" in capsys.readouterr().err
  assert second["train"].images[0, 0].max() == 0  # the new image, not the cached one
  np.testing.assert_array_equal(second["train"].images[0, 1], first["train"].images[0, 1])


def _first_image() -> str:
  """The train split's first image of `_fake_mini_imagenet`."""
  return f"n{0}{0:07d}{0:08d}.png"


def _first_rows(text: str, change) -> str:
  lines = text.splitlines()
  return "\n".join(lines[:1] + change(lines[1]) + lines[2:]) + "\n"


MINI_ROWS = {  # what is done to the folder after the first load -> what the second load says
  "images/ deleted": (
    lambda folder: shutil.rmtree(folder / "images"),
    vj.MissingDataError,
    r"No images/ folder in",
  ),
  "the folder deleted": (
    lambda folder: shutil.rmtree(folder),
    vj.MissingDataError,
    r"mini-ImageNet folder .* does not exist",
  ),
}


@pytest.mark.parametrize("row", list(MINI_ROWS))
def test_a_mini_imagenet_cache_never_stands_in_for_a_changed_folder(row, tmp_path):
  """A cache never stands in for a folder whose images/, or itself, is deleted: refused."""
  change, error, message = MINI_ROWS[row]
  folder = _fake_mini_imagenet(tmp_path / "mini")
  _load(folder, tmp_path / "cache")
  change(folder)
  with pytest.raises(error, match=message):
    _load(folder, tmp_path / "cache")


def test_two_full_mini_imagenet_folders_get_two_caches(tmp_path):
  """The cache's name differs between two folders, and between the full and the small set."""
  one, two = tmp_path / "one", tmp_path / "two"
  assert mi._cache_name(one, False) != mi._cache_name(two, False)
  assert mi._cache_name(one, False) != mi._cache_name(one, True)


CSV_ROWS = {  # a CSV -> (error, message); None: loads (documented)
  "one image listed 12 times": (
    lambda text: _first_rows(text, lambda row: [row] * 12),
    vj.DataError,
    rf"train.csv, line 3: {_first_image()} is listed again \(first on line 2\)",
  ),
  "a byte-order mark": (lambda text: "\ufeff" + text, None, None),
  "; separators": (
    lambda text: text.replace(",", ";"),
    vj.DataError,
    r"train.csv: fields are separated by \";\"",
  ),
  "a row without a label": (
    lambda text: _first_rows(text, lambda row: [row.split(",")[0] + ","]),
    vj.DataError,
    r"train.csv, line 2: expected \"<image>,<wnid>\"",
  ),
}


@pytest.mark.parametrize("row", list(CSV_ROWS))
def test_mini_imagenet_csvs_are_read_or_refused_naming_file_and_line(row, tmp_path):
  change, error, message = CSV_ROWS[row]
  folder = _fake_mini_imagenet(tmp_path / "mini", csv_text=change)
  if error is None:
    loaded = _load(folder, tmp_path / "cache")
    assert loaded["train"].wnids.tolist() == ["n00000000", "n00000001"]
    return
  with pytest.raises(error, match=message):
    _load(folder, tmp_path / "cache")


def test_an_unwritable_mini_imagenet_cache_fails_before_decoding(tmp_path, monkeypatch):
  """A cache folder under a file (or on a read-only mount) is refused before any image is
  decoded."""
  folder = _fake_mini_imagenet(tmp_path / "mini")
  (tmp_path / "file").write_text("")
  decoded = []
  monkeypatch.setattr(mini_imagenet_files, "_decode", lambda path: decoded.append(path))
  caches = [tmp_path / "file" / "cache"]  # under a file
  read_only = tmp_path / "read_only"  # a read-only mount, where mounting is allowed (root)
  read_only.mkdir()
  mount = ["mount", "-t", "tmpfs", "-o", "ro,size=100k", "tmpfs", str(read_only)]
  mounted = subprocess.run(mount, capture_output=True).returncode == 0
  if mounted:
    caches.append(read_only / "cache")
  try:
    for cache in caches:
      with pytest.raises(vj.StorageError, match=rf"mini-ImageNet cache folder {cache} cannot be"):
        _load(folder, cache)
  finally:
    if mounted:
      subprocess.run(["umount", str(read_only)], check=True)
  assert decoded == []


ENV_ROWS = {  # MINI_IMAGENET_DIR -> the one line
  "missing": (lambda tmp: tmp / "nowhere", "does not exist"),
  "a file": (lambda tmp: tmp / "file.txt", "is a file, not a folder"),
}


@pytest.mark.parametrize("row", list(ENV_ROWS))
def test_a_bad_mini_imagenet_dir_is_one_line_and_exit_2(row, tmp_path, monkeypatch, capsys):
  """A missing MINI_IMAGENET_DIR, or a file, is one error line without a traceback, exit 2."""
  make, needle = ENV_ROWS[row]
  (tmp_path / "file.txt").write_text("")
  monkeypatch.setenv("MINI_IMAGENET_DIR", str(make(tmp_path)))
  argv = ["--preset", "quick", "--workdir", str(tmp_path / "run"), "--no-compilation-cache"]
  argv += ["--cache-dir", str(tmp_path / "cache")]
  assert cli.main_entry(mini_imagenet.main, argv) == 2
  err = capsys.readouterr().err
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and needle in errors[0] and "Traceback" not in err, err


def test_an_omniglot_dir_that_is_a_file_says_so(tmp_path):
  (tmp_path / "zips").write_text("")
  with pytest.raises(vj.MissingDataError, match=r"Omniglot folder .*zips is a file, not a folder"):
    vj.data.load_omniglot(tmp_path / "zips", cache_dir=tmp_path / "cache")


# -- paper_table: a cell only from the paper's settings -------------------------------------------


def _results(folder: Path, config: dict, test: dict) -> Path:
  folder.mkdir(parents=True)
  (folder / "results.json").write_text(json.dumps({"config": config, "test": test}))
  return folder


def _omniglot(**changes) -> dict:
  """The 5-way 1-shot preset's config recorded flat (as runs before the config's parts did;
  still read), with `changes`."""
  config = presets.get_config("omniglot", "5way1shot", "vampire").flat()
  return json.loads(json.dumps({**config, **changes}))


def _nested_omniglot(**changes) -> dict:
  """The 5-way 1-shot preset's config as runs record it now (by part), with `changes`."""
  config = presets.get_config("omniglot", "5way1shot", "vampire").replace(**changes)
  return json.loads(json.dumps(config_records.to_record(config)))


ACCURACY = {"accuracy": 0.95, "accuracy_ci95": 0.004, "num_tasks": 1000, "ece": 0.02, "mce": 0.1}


def test_a_run_with_the_papers_schedule_but_other_settings_fills_no_cell(tmp_path, capsys):
  """A run on the paper's schedule but with Conv4-16, alpha 0.1, beta 0.001 and 4 test draws
  fills no cell; the reason names each difference (in `RunConfig.flat()`'s order: the
  experiment's fields, then the algorithm's); a seed or a speed setting of its own does not."""
  other = _omniglot(num_filters=16, inner_lr=0.1, kl_weight=0.001, num_mc_test=4)
  _results(tmp_path / "runs" / "other", other, ACCURACY)
  replicate = _nested_omniglot(seed=3, eval_batch_tasks=7)  # recorded by part, as runs now do
  _results(tmp_path / "runs" / "replicate", replicate, ACCURACY)
  tables = paper_table.main([str(tmp_path / "runs")])
  capsys.readouterr()
  cell = next(
    c
    for c in tables["omniglot"]
    if (c["split"], c["algorithm"], c["setting"]) == ("original", "vampire", "5way1shot")
  )
  assert cell["measured"]["run"] == str(
    tmp_path / "runs" / "replicate"
  )  # seed, speed: same protocol
  [apart] = tables["not_paper_protocol"]
  assert apart["run"] == str(tmp_path / "runs" / "other")
  assert apart["reason"] == (
    "num_filters 16 (paper preset 64); inner_lr 0.1 (paper preset 0.01); kl_weight 0.001 "
    "(paper preset 0.1); num_mc_test 4 (paper preset 10)"
  )


def test_the_protocol_is_the_presets_current_config(tmp_path, monkeypatch, capsys):
  """A preset that gains a setting takes runs without it out of its cells."""
  _results(tmp_path / "runs" / "run", _omniglot(), ACCURACY)
  assert paper_table.main([str(tmp_path / "runs")])["not_paper_protocol"] == []
  get_config = presets.get_config
  monkeypatch.setattr(
    presets,
    "get_config",
    lambda *a: get_config(*a).replace(meta_grad_clip_norm=1.0),
  )
  [apart] = paper_table.main([str(tmp_path / "runs")])["not_paper_protocol"]
  assert apart["reason"] == "meta_grad_clip_norm 10.0 (paper preset 1.0)"
  capsys.readouterr()


RESULTS_ROWS = {  # results.json -> the warning's end
  "no test": ({"config": _omniglot()}, 'no "test" (a run that has not finished its test?)'),
  "accuracy as text": (
    {"config": _omniglot(), "test": dict(ACCURACY, accuracy="95%")},
    "test[\"accuracy\"] is '95%', not a number",
  ),
  "ways missing": (
    {"config": {k: v for k, v in _omniglot().items() if k != "ways"}, "test": ACCURACY},
    'config["ways"] is missing or not an integer',
  ),
  "ways missing, recorded nested": (
    {"config": {k: v for k, v in _nested_omniglot().items() if k != "ways"}, "test": ACCURACY},
    'config["ways"] is missing or not an integer',
  ),
  "a list": ([1, 2], "not a JSON object"),
}


@pytest.mark.parametrize("row", list(RESULTS_ROWS))
def test_a_results_json_paper_table_cannot_read_is_skipped_with_a_line(row, tmp_path, capsys):
  """A results.json paper_table cannot read is skipped with a warning naming the file and
  what is wrong with it, and the summary counts it (not "0 runs" in silence, nor a
  traceback)."""
  record, why = RESULTS_ROWS[row]
  folder = tmp_path / "runs" / "run"
  folder.mkdir(parents=True)
  (folder / "results.json").write_text(json.dumps(record))
  assert paper_table.entry([str(tmp_path / "runs")]) == 0
  out, err = capsys.readouterr()
  assert f"warning: skipped {folder / 'results.json'}: {why}" in err, err
  assert "(0 runs read; 1 file skipped, see the warnings)" in out


def test_the_omniglot_cli_names_a_file_given_as_its_folder(tmp_path, capsys):
  """A file given as the Omniglot folder is named as a file, not a folder."""
  (tmp_path / "omniglot").write_text("")
  argv = ["--preset", "quick", "--workdir", str(tmp_path / "run"), "--no-compilation-cache"]
  argv += ["--data-dir", str(tmp_path / "omniglot"), "--cache-dir", str(tmp_path / "cache")]
  assert cli.main_entry(omniglot.main, argv) == 2
  err = capsys.readouterr().err
  assert f"error: Omniglot folder {tmp_path / 'omniglot'} is a file, not a folder" in err, err
