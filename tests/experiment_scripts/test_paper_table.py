"""experiments.paper_table: the paper's tables beside the measured ones, from run folders.

Fake run folders (results.json, comparison.json, calibration.json written by
hand, no training) check the cells, the runs kept apart and the JSON; a real
tiny run checks that what `experiments.omniglot` writes is read.
"""

import json
from pathlib import Path

import pytest

from experiments import paper_table, presets
from vampire_jax.runs import config_records


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


def _config(experiment: str, preset: str, algorithm: str, *, flat: bool = False, **changes) -> dict:
  """The paper preset's config as a run records it, with `changes`: nested by part
  (`config_records.to_record`, as runs write it now), or `flat` as older runs recorded it."""
  config = presets.get_config(experiment, preset, algorithm).replace(**changes)
  record = config.flat() if flat else config_records.to_record(config)
  return json.loads(json.dumps(record))  # tuples -> lists, as in results.json


def _write(folder, name, record):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / name).write_text(json.dumps(record))
  return folder


def _accuracy(value, ci, num_tasks, **more) -> dict:
  return {
    "accuracy": value,
    "accuracy_ci95": ci,
    "num_tasks": num_tasks,
    "nll": 0.3,
    "ece": 0.02,
    "mce": 0.1,
    **more,
  }


def _regression(mse, ci, ece, mce) -> dict:
  return {"mse": mse, "mse_ci95": ci, "ece": ece, "mce": mce, "nll": 1.5, "num_tasks": 1000}


@pytest.fixture
def runs_root(tmp_path):
  """A `runs/` folder: Omniglot, mini-ImageNet, a regression comparison, a compare folder
  (configs recorded nested, two of them flat as older runs did)."""
  root = tmp_path / "runs"
  omniglot = lambda **c: _config("omniglot", "5way1shot", "vampire", **c)  # noqa: E731
  _write(
    root / "vampire_1000",
    "results.json",
    {"config": omniglot(), "test": _accuracy(0.9512, 0.0041, 1000)},
  )
  _write(  # recorded flat, as runs before the config's parts were
    root / "vampire_200",
    "results.json",
    {"config": omniglot(flat=True), "test": _accuracy(0.80, 0.02, 200)},
  )
  _write(
    root / "maml_random_20w5s_short",
    "results.json",
    {
      "config": _config("omniglot", "20way5shot", "maml", split="random", num_meta_steps=300),
      "test": _accuracy(0.7734, 0.0123, 1000),
    },
  )
  mini = _write(
    root / "mini_vampire",
    "results.json",
    {
      "config": _config("mini_imagenet", "5way1shot", "vampire"),
      "test": _accuracy(0.5021, 0.0080, 600, ece=0.0210, mce=0.0900),
    },
  )
  _write(mini, "calibration.json", {"config": {}, "ece": 0.0123, "mce": 0.0456, "num_tasks": 15504})
  _write(
    root / "mini_maml",
    "results.json",
    {
      "config": _config("mini_imagenet", "5way1shot", "maml", flat=True),
      "test": _accuracy(0.4610, 0.0090, 600, ece=0.0350, mce=0.1500),
    },
  )
  paper = lambda name: _config("regression", "paper", name)  # noqa: E731
  _write(
    root / "regression_paper",
    "results.json",
    {
      "preset": "paper",
      "methods": {
        "vampire": {**_regression(2.5, 0.1, 0.031, 0.082), "config": paper("vampire")},
        "maml": {"diverged": "meta-training diverged at step 140", "config": paper("maml")},
      },
    },
  )
  compare_folder = _write(
    root / "compare_regression",
    "comparison.json",
    {"methods": {"platipus": {**_regression(9.0, 0.5, 0.5, 0.5), "config": paper("platipus")}}},
  )
  _write(
    compare_folder / "platipus",
    "results.json",  # the method's own file wins
    {"config": paper("platipus"), "test": _regression(1.9, 0.08, 0.041, 0.120)},
  )
  return root


def _section(markdown: str, title_start: str) -> str:
  """The text of the markdown section whose heading starts with `title_start`."""
  part = markdown.split(f"## {title_start}", 1)[1]
  return part.split("\n## ", 1)[0]


def _row(section: str, *first_cells: str) -> list[str]:
  start = "| " + " | ".join(first_cells) + " |"
  line = next(line for line in section.splitlines() if line.startswith(start))
  return [cell.strip() for cell in line.strip("|").split("|")]


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


def test_markdown_cells_and_runs_kept_apart(runs_root, capsys):
  tables = paper_table.main([str(runs_root)])
  markdown = capsys.readouterr().out
  assert tables["num_runs_read"] == 8  # the compare folder's platipus once, not twice
  omniglot = _section(markdown, "Omniglot")
  # Measured, the paper's value and CI, and the difference; of two matching runs, the larger.
  original = _row(omniglot, "original", "VAMPIRE")
  assert original[2] == "95.12 ± 0.41 (paper 96.27 ± 0.38, Δ -1.15)"
  assert original[3] == "unmeasured (paper 98.77 ± 0.27)"
  assert (
    f"- original 5-way 1-shot VAMPIRE: `{runs_root / 'vampire_1000'}` (1000 test tasks; the "
    "one with the most test tasks of 2 matching runs)"
  ) in omniglot
  # The 300-step run is not the paper's protocol: its cell stays unmeasured, and it is listed apart.
  assert _row(omniglot, "random", "MAML")[5] == "unmeasured (paper 98.9 ± 0.2)"
  assert "77.34" not in omniglot
  apart = _section(markdown, "Not the paper's protocol")
  row = _row(apart, f"`{runs_root / 'maml_random_20w5s_short'}`")
  assert row[1:] == [
    "omniglot",
    "MAML",
    "random split, 20-way 5-shot",
    "accuracy 77.34 ± 1.23 % (1000 tasks)",
    "num_meta_steps 300 (paper preset 15000)",
  ]
  # mini-ImageNet, regression, calibration.
  mini = _section(markdown, "mini-ImageNet")
  assert _row(mini, "VAMPIRE")[1] == "50.21 ± 0.80 (paper 51.54 ± 0.74, Δ -1.33)"
  assert _row(mini, "MAML")[2] == "unmeasured (paper 63.15 ± 0.91)"
  regression = _section(markdown, "Sine/line regression")
  assert _row(regression, "VAMPIRE") == [
    "VAMPIRE",
    "2.500 ± 0.100",
    "2.24",
    "+0.260",
    "0.0310",
    "–",
    "0.0820",
    "–",
  ]
  assert _row(regression, "PLATIPUS")[1:4] == ["1.900 ± 0.080", "1.86", "+0.040"]
  assert _row(regression, "MAML")[1:4] == ["unmeasured", "1.96", "–"]
  calibration = _section(markdown, "Calibration")
  assert _row(calibration, "VAMPIRE") == [
    "VAMPIRE",
    "0.0123",
    "0.008 ± 0.002",
    "0.0456",
    "0.038",
    "calibration protocol (calibration.json), 15504 tasks",
  ]
  assert _row(calibration, "MAML") == [
    "MAML",
    "0.0350",
    "0.0410 ± 0.005",
    "0.1500",
    "0.124",
    "test split (results.json), 600 tasks",
  ]
  assert _row(calibration, "BMAML")[1] == "unmeasured"
  other = _section(markdown, "Other runs")
  assert (
    "diverged: meta-training diverged at step 140"
    in _row(other, f"`{runs_root / 'regression_paper' / 'maml'}`")[5]
  )


def test_json_output(runs_root, tmp_path, capsys):
  path = tmp_path / "out" / "table.json"
  paper_table.main(
    [str(runs_root / "vampire_1000"), str(runs_root / "regression_paper"), "--json", str(path)]
  )
  capsys.readouterr()
  tables = json.loads(path.read_text())
  cell = next(
    c
    for c in tables["omniglot"]
    if (c["split"], c["algorithm"], c["setting"]) == ("original", "vampire", "5way1shot")
  )
  assert cell["paper"] == {"value": 96.27, "ci95": 0.38, "text": "96.27 ± 0.38"}
  assert cell["measured"] == pytest.approx(
    {
      "value": 95.12,
      "ci95": 0.41,
      "num_tasks": 1000,
      "run": str(runs_root / "vampire_1000"),
      "matched_runs": 1,
    }
  )
  assert cell["difference"] == pytest.approx(-1.15)
  assert len(tables["omniglot"]) == 16 and len(tables["mini_imagenet"]) == 4
  assert sum(c["measured"] is not None for c in tables["omniglot"]) == 1
  vampire = next(r for r in tables["regression"] if r["algorithm"] == "vampire")
  assert vampire["paper"]["ece"] is None and vampire["paper"]["mse"]["value"] == 2.24
  assert vampire["measured"]["mse"] == 2.5 and vampire["difference"] == pytest.approx(0.26)
  assert [r["reason"] for r in tables["other_runs"]] == [
    "diverged: meta-training diverged at step 140"
  ]
  assert tables["not_paper_protocol"] == []


def test_a_missing_folder_is_one_line_and_exit_code_2(tmp_path, capsys):
  assert paper_table.entry([str(tmp_path / "nowhere")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: "), err
  assert f"{tmp_path / 'nowhere'} is not a folder" in err


def test_a_real_tiny_run_is_read_and_kept_apart(tiny_omniglot_run, capsys):
  workdir, config, results = tiny_omniglot_run
  tables = paper_table.main([str(workdir)])
  capsys.readouterr()
  assert tables["num_runs_read"] == 1
  [listed] = tables["not_paper_protocol"]
  test = results["test"]
  assert listed["run"] == str(workdir) and listed["algorithm"] == "vampire"
  assert listed["measured"] == (
    f"accuracy {100 * test['accuracy']:.2f} ± "
    f"{100 * test['accuracy_ci95']:.2f} % ({test['num_tasks']} tasks)"
  )
  # Every setting that differs from the preset, not only the schedule (issue 31),
  # in `RunConfig.flat()`'s order: the parts, the experiment's fields, the algorithm's.
  c, spec = config, config.algorithm
  assert listed["reason"] == (
    f"tasks_per_step {c.schedule.tasks_per_step} (paper preset 32); "
    f"num_meta_steps {c.schedule.num_meta_steps} (paper preset 15000); "
    f"num_val_tasks {c.evaluation.num_val_tasks} (paper preset 200); eval_every "
    f"{c.evaluation.eval_every} (paper preset 500); test_parameters best (paper preset final); "
    f"kernel_init_gain {c.kernel_init_gain} (paper preset 1.0); "
    f"num_val_alphabets {c.num_val_alphabets} (paper preset 0); num_val_characters "
    f"{c.num_val_characters} (paper preset 0); num_filters {c.num_filters} (paper preset 64); "
    f"num_inner_steps {spec.num_inner_steps} (paper preset 5); inner_lr {spec.inner_lr} (paper "
    f"preset 0.01); kl_weight {spec.kl_weight} (paper preset 0.1); num_mc_test "
    f"{spec.num_mc_test} (paper preset 10); meta_grad_clip_separately False (paper preset True)"
  )
  assert all(cell["measured"] is None for cell in tables["omniglot"])
