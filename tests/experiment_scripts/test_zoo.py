"""experiments.zoo: trained runs in zoo/ that load as runs and verify on this machine.

Two parts. Tiny regression runs (trained here, seconds) check the mechanism: `add` keeps
exactly the tested checkpoint and the run's own files, a tar from elsewhere adds the same,
the cell loads with the unmodified `vj.load_run`, `verify` finds its numbers equal and
says so when they are not, the command derived from the config rebuilds that config, and
the generated tables. Then the repository's zoo/ itself: its checksums, every cell loads
and predicts, the README's table is the one the zoo gives, and a small verify passes.
"""

import argparse
import dataclasses
import json
import shlex
import shutil
import subprocess
import tarfile

import jax
import jaxlib
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, regression, zoo, zoo_verify
from tests.conftest import REPO, tiny_regression_config
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs import config_records

TINY = dict(num_test_tasks=4, eval_batch_tasks=2)


def _train(workdir, algorithm, **changes):
  config = tiny_regression_config(algorithm, **{**TINY, **changes})
  vj.train_and_evaluate(
    regression.make_problem(config), config, workdir, progress=False, print_fn=lambda m: None
  )
  return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two finished tiny runs: VAMPIRE testing the best by validation, MAML the final state."""
  root = tmp_path_factory.mktemp("zoo_runs")
  return {
    "best": _train(root / "comparison" / "vampire", "vampire", num_meta_steps=4),
    "final": _train(
      root / "comparison" / "maml", "maml", num_meta_steps=6, test_parameters="final"
    ),
  }


@pytest.fixture
def readme(tmp_path):
  path = tmp_path / "README.md"
  path.write_text(f"before\n{zoo.TABLE_START}\nold rows\n{zoo.TABLE_END}\nafter\n")
  return path


def _add(runs, tmp_path, which="best", name="tiny"):
  zoo_dir = tmp_path / "zoo"
  zoo.add([runs[which]], zoo_dir, name=name)
  return zoo_dir


def _one_line(error) -> str:
  message = str(error.value)
  assert len(message.splitlines()) == 1, message
  return message


def _config_of_command(command: str) -> dict:
  """The config that `python -m experiments.regression ... --algorithms A` trains for A:
  the preset for A with the flags applied, less what A ignores (as `compare` builds it), as
  run.json records it (`config_records.to_record`)."""
  words = shlex.split(command)
  assert words[:3] == ["python", "-m", "experiments.regression"], command
  words[words.index("--algorithms")] = "--algorithm"  # one method: the same config
  config, _ = cli.parse(words[3:], "", regression.PRESETS, regression.get_config)
  return json.loads(json.dumps(config_records.to_record(config)))


def _reference(**numbers):
  return zoo_verify.Reference(numbers, {"mse": np.array([1.0, 2.0], np.float32)}, 2)


def _cpuinfo(model: int, flags: str) -> str:
  """/proc/cpuinfo of a 2-core "AMD EPYC" (both blocks alike) of the given model."""
  block = (
    f"processor\t: {{}}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {model}\n"
    f"model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu sse2 avx avx2 fma {flags}\n"
  )
  return "\n".join(block.format(i) for i in range(2))


# Zen 3 (family 25 model 1) and Zen 4 (model 17): both call themselves "AMD EPYC".
ZEN3 = _cpuinfo(1, "vaes")


ZEN4 = _cpuinfo(17, "vaes avx512f avx512bw avx512_vnni avx512_bf16")


def _as_if_computed_elsewhere(zoo_dir, factor):
  """The cell's reported test numbers scaled by `factor` (another CPU's last bits, or a
  tampered cell), the manifest's checksums made to match."""
  results_path = zoo_dir / "tiny" / "results.json"
  results = json.loads(results_path.read_text())
  for name in ("mse", "nll"):
    results["test"][name] *= factor
  results_path.write_text(json.dumps(results))
  manifest = zoo.read_manifest(zoo_dir)
  manifest["cells"]["tiny"]["files"] = zoo.checksums(zoo_dir / "tiny")
  zoo.write_manifest(zoo_dir, manifest)


def test_the_readmes_zoo_verify_command_names_omniglot_dir():
  lines = [line for line in (REPO / "README.md").read_text().splitlines() if "zoo verify" in line]
  assert lines and all("OMNIGLOT_DIR=" in line for line in lines), lines


def test_zoo_verify_draws_its_progress_bars_on_stderr_and_prints_its_table_alone(
  monkeypatch, capsys
):
  pytest.importorskip("tqdm")

  def verify_cell(zoo_dir, name, entry, num_tasks, machine):  # what verify_cell does, quickly
    print("Omniglot: cached arrays (what loading a cell's data prints)")
    with zoo._progress_bar(name, 3) as on_batch:
      for done in (1, 2, 3):
        on_batch(done, 3)
    return zoo.Verified(name, 3, False, "equal", "", "1", "1", 0.1)

  monkeypatch.setattr(zoo, "verify_cell", verify_cell)
  assert zoo.main(["verify", "--cells", "regression_cpu_maml", "--num-test-tasks", "3"]) == 0
  out, err = capsys.readouterr()
  assert "verifying regression_cpu_maml" in err and "verifying" not in out
  assert "Omniglot: cached arrays" in err and "Omniglot" not in out
  assert out.startswith("| cell | paper | trained (device, commit) | verified here (")
  assert all(
    line.startswith("|") or not line or "cells verified" in line for line in out.splitlines()
  )


def test_the_omniglot_quick_figures_are_said_to_be_the_zoo_cells_and_show_its_numbers():
  row = next(
    line for line in (REPO / "docs" / "reliability.md").read_text().splitlines()
    if line.startswith("| `omniglot_quick_reliability.png`")
  )  # fmt: skip
  entry = zoo.read_manifest(zoo.ZOO)["cells"]["omniglot_original_quick_vampire"]
  test = entry["test"]
  assert "zoo/omniglot_original_quick_vampire" in row and "plots.run_figures" in row
  shown = f"{100 * test['accuracy']:.2f} ± {100 * test['accuracy_ci95']:.2f} %, ECE "
  assert shown + f"{test['ece']:.3f}, MCE {test['mce']:.3f}" in row


@pytest.mark.parametrize(
  "which, checkpoint", [("best", "best/4"), ("final", "checkpoints/6")], ids=["best", "final"]
)
def test_a_cell_holds_the_runs_own_files_and_only_the_tested_checkpoint(
  runs, tmp_path, which, checkpoint
):
  source = runs[which]
  results = json.loads((source / "results.json").read_text())
  zoo_dir = _add(runs, tmp_path, which)
  cell = zoo_dir / "tiny"
  entry = zoo.read_manifest(zoo_dir)["cells"]["tiny"]
  assert entry["checkpoint"] == checkpoint == f"{checkpoint.split('/')[0]}/{results['tested_step']}"
  top = sorted(p.name for p in cell.iterdir())
  assert top == sorted(
    ["run.json", "results.json", "metrics.jsonl", "test_per_task.npz", checkpoint.split("/")[0]]
  )
  assert [p.name for p in (cell / checkpoint).parent.iterdir()] == [checkpoint.split("/")[1]]
  for path, recorded in entry["files"].items():  # each file byte for byte the run's
    assert (cell / path).read_bytes() == (source / path).read_bytes(), path
    assert recorded["bytes"] == (source / path).stat().st_size
  assert entry["bytes"] == sum(f["bytes"] for f in entry["files"].values())
  assert entry["test"]["mse"] == results["test"]["mse"]
  assert entry["commit"] == results["git_commit"] and entry["device"] == results["device"]
  assert entry["train_seconds"] == results["wall_time_s"]["train"]
  # The unmodified load_run reads it: the same meta-parameters as the run's own folder,
  # and it writes nothing into the cell.
  loaded, original = vj.load_run(cell), vj.load_run(source)
  assert jax.tree.all(
    jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), loaded.meta_params, original.meta_params)
  )
  assert zoo.check_cells(zoo_dir) == []


def test_the_checksums_find_a_changed_missing_or_extra_file(runs, tmp_path):
  zoo_dir = _add(runs, tmp_path)
  (zoo_dir / "tiny" / "results.json").write_text("{}")
  (zoo_dir / "tiny" / "metrics.jsonl").unlink()
  (zoo_dir / "tiny" / "extra.txt").write_text("x")
  (zoo_dir / "stray").mkdir()
  assert zoo.check_cells(zoo_dir) == [
    "zoo/stray is not in the manifest",
    "zoo/tiny/extra.txt is not in the manifest",
    "zoo/tiny/metrics.jsonl is missing",
    "zoo/tiny/results.json has changed (its sha256 is not the manifest's)",
  ]
  with pytest.raises(ConfigError, match="^zoo verify: the zoo does not match its manifest"):
    zoo.verify(zoo_dir, "tiny")


def test_a_tar_from_another_machine_adds_the_same_cell(runs, tmp_path):
  archive = tmp_path / "cell.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:  # as a GPU session packs a cell's folder
    tar.add(runs["best"], arcname="runs/paper/vampire")
  from_tar, from_folder = tmp_path / "a", tmp_path / "b"
  assert zoo.add([archive], from_tar, name="tiny") == ["tiny"]
  zoo.add([runs["best"]], from_folder, name="tiny")
  cells = [zoo.read_manifest(z)["cells"]["tiny"] for z in (from_tar, from_folder)]
  assert cells[0] == cells[1]


def test_a_folder_of_runs_adds_each_and_their_commands_rebuild_their_configs(tmp_path, capsys):
  """A regression comparison's folder holds one run per method: `add` takes each finished
  one. A run that differs from its preset beyond speed knobs needs a name; its command,
  derived from its config, gives that config again."""
  root = tmp_path / "regression_quick_seed0"
  for algorithm in ("vampire", "maml"):
    _train(root / algorithm, algorithm, num_meta_steps=2, seed=3, hidden_sizes=(8, 8, 8))
  shutil.copytree(root / "maml", root / "still_training")  # a third, not finished yet
  (root / "still_training" / "results.json").unlink()
  with pytest.raises(ConfigError) as error:
    zoo.add([root], tmp_path / "zoo")
  assert capsys.readouterr().out == (
    f"skipped {root / 'still_training'}: it has not finished (no test in its results.json)\n"
  )
  assert _one_line(error).startswith(
    f"zoo add: {root / 'maml'} differs from the quick preset in eval_every, hidden_sizes, "
  )
  assert _one_line(error).endswith("; name its cell with --name")
  for algorithm in ("vampire", "maml"):
    name, entry = zoo.describe_run(root / algorithm, name=f"tiny_{algorithm}")
    assert (name, entry["preset"], entry["algorithm"]) == (f"tiny_{algorithm}", "quick", algorithm)
    assert " --seed 3" in entry["command"] and " --hidden-sizes 8 8 8" in entry["command"]
    recorded = json.loads((root / algorithm / "run.json").read_text())["config"]
    assert _config_of_command(entry["command"]) == recorded, entry["command"]


def test_a_preset_run_is_named_after_its_preset():
  """Speed and evaluation knobs (paper_table.NOT_PROTOCOL) change the command, not the name."""
  config = json.loads(json.dumps(regression.get_config("cpu", "vampire").flat()))  # by name
  assert zoo.matching_preset("regression", config) == ("cpu", {})
  faster = dict(config, eval_batch_tasks=50, seed=2)
  preset, changed = zoo.matching_preset("regression", faster)
  assert (preset, changed) == ("cpu", {"eval_batch_tasks": 50, "seed": 2})
  assert zoo.cell_name("regression", preset, faster) == "regression_cpu_vampire_seed2"
  assert zoo.command_of("regression", preset, "vampire", changed) == (
    "python -m experiments.regression --preset cpu --algorithms vampire "
    "--eval-batch-tasks 50 --seed 2"
  )


def test_add_refuses_in_one_line(runs, tmp_path):
  zoo_dir = _add(runs, tmp_path)
  with pytest.raises(ConfigError) as error:
    zoo.add([runs["best"]], zoo_dir, name="tiny")
  message = _one_line(error)
  assert message.startswith(f"zoo add: {zoo_dir / 'tiny'} exists")  # the cell and the cause
  assert "pass --replace to put this run in its place" in message  # the fix
  zoo.add([runs["best"]], zoo_dir, name="tiny", replace=True)  # and with --replace it does
  assert zoo.check_cells(zoo_dir) == []
  with pytest.raises(ConfigError) as error:
    zoo.add([runs["best"].parent], zoo_dir, name="one")
  assert _one_line(error).startswith("zoo add: --name names one cell; ")
  with pytest.raises(ConfigError) as error:
    zoo.add([tmp_path / "nothing"], zoo_dir)
  message = _one_line(error)
  assert message.startswith(f"zoo add: {tmp_path / 'nothing'} ")
  assert "is not a folder or a tar file" in message  # what it must be
  broken = tmp_path / "broken"
  shutil.copytree(runs["final"], broken)
  shutil.rmtree(broken / "checkpoints" / "6")
  with pytest.raises(ConfigError) as error:
    zoo.add([broken], zoo_dir, name="broken")
  assert _one_line(error).startswith(f"zoo add: {broken} has no checkpoints/6, the checkpoint")
  (broken / "results.json").unlink()
  with pytest.raises(ConfigError) as error:
    zoo.add([broken], zoo_dir, name="broken")
  assert _one_line(error).startswith(f"zoo add: {broken} has no finished results.json")
  assert sorted(zoo.read_manifest(zoo_dir)["cells"]) == ["tiny"]
  assert zoo.check_cells(zoo_dir) == []  # nothing half-added


@pytest.mark.parametrize("num_tasks", [None, 3])
def test_verify_scores_a_cell_again_to_the_same_numbers(runs, tmp_path, num_tasks, readme):
  zoo_dir = _add(runs, tmp_path, "final")
  (row,) = zoo.verify(zoo_dir, "tiny", num_tasks, record=True, readme=readme)
  assert (row.outcome, row.detail, row.passed) == ("equal", "", True), row
  assert row.num_tasks == (num_tasks or 4) and row.trained == row.verified
  (recorded,) = zoo.read_manifest(zoo_dir)["cells"]["tiny"]["verifications"]
  assert recorded["machine"] == zoo_verify.this_machine() and recorded["outcome"] == "equal"
  assert zoo.check_cells(zoo_dir) == []  # the cell is as it was
  # Recorded equal here: from now on it must stay equal on this machine.
  (row,) = zoo.verify(zoo_dir, "tiny", num_tasks)
  assert row.expected_equal and row.passed


def test_verify_fails_a_cell_whose_numbers_are_not_what_its_run_reported(runs, tmp_path, readme):
  """A cell that says another MSE (its results.json edited, the manifest made to match) is
  scored again and found different: exit code 1 and a FAILED row."""
  zoo_dir = _add(runs, tmp_path, "final")
  results_path = zoo_dir / "tiny" / "results.json"
  results = json.loads(results_path.read_text())
  results["test"]["mse"] *= 1.5
  results_path.write_text(json.dumps(results))
  manifest = zoo.read_manifest(zoo_dir)
  manifest["cells"]["tiny"]["files"] = zoo.checksums(zoo_dir / "tiny")
  zoo.write_manifest(zoo_dir, manifest)
  args = ["--zoo", str(zoo_dir), "--readme", str(readme), "verify", "--cells", "tiny"]
  assert zoo.main(args) == 1
  (row,) = zoo.verify(zoo_dir, "tiny")
  assert row.outcome == "differs" and row.detail.startswith("mse ") and not row.passed
  # Its first 2 tasks are still its run's (the per-task file is unchanged).
  assert zoo.main(args + ["--num-test-tasks", "2"]) == 0


def test_verify_says_when_the_data_here_are_not_the_runs(runs, tmp_path, monkeypatch):
  """Omniglot records its zips' names, sizes and sha256: other files give other tasks."""
  zoo_dir = _add(runs, tmp_path, "final")
  results_path = zoo_dir / "tiny" / "results.json"
  results = json.loads(results_path.read_text())
  results["data"]["fingerprint"] = [["images_evaluation.zip", 5, "aa"]]
  results_path.write_text(json.dumps(results))
  manifest = zoo.read_manifest(zoo_dir)
  manifest["cells"]["tiny"]["files"] = zoo.checksums(zoo_dir / "tiny")
  zoo.write_manifest(zoo_dir, manifest)
  build = zoo_verify.make_problem

  def with_files(files):
    def make_problem(run):
      problem = build(run)
      return problem._replace(data_info=dict(problem.data_info, fingerprint=files))

    return make_problem

  monkeypatch.setattr(zoo_verify, "make_problem", with_files([["x.zip", 5, "bb"]]))
  (row,) = zoo.verify(zoo_dir, "tiny")
  assert (row.outcome, row.passed) == ("error", False)
  assert row.detail.startswith("the data here are not the run's (its files: [['images_eval")
  same = results["data"]["fingerprint"]
  monkeypatch.setattr(zoo_verify, "make_problem", with_files(same))
  assert zoo.verify(zoo_dir, "tiny")[0].outcome == "equal"


def test_fewer_tasks_need_the_per_task_file(runs, tmp_path):
  zoo_dir = _add(runs, tmp_path, "final")
  (zoo_dir / "tiny" / "test_per_task.npz").unlink()
  manifest = zoo.read_manifest(zoo_dir)
  manifest["cells"]["tiny"]["files"] = zoo.checksums(zoo_dir / "tiny")
  zoo.write_manifest(zoo_dir, manifest)
  (row,) = zoo.verify(zoo_dir, "tiny", 2)
  assert (row.outcome, row.detail) == (
    "error",
    "no per-task scores: verify it on all its 4 tasks",
  )
  (row,) = zoo.verify(zoo_dir, "tiny")  # all its tasks: results.json is enough
  assert row.outcome == "equal"


def test_a_large_per_task_file_is_kept_as_its_scores(runs, tmp_path, monkeypatch):
  """Above the size a cell keeps whole (a 20-way classifier's probabilities), the cell keeps
  the per-task scores taken from the run's file, and fewer tasks still verify."""
  monkeypatch.setattr(zoo, "PER_TASK_LIMIT_BYTES", 100)
  zoo_dir = _add(runs, tmp_path, "final")
  cell = zoo_dir / "tiny"
  assert not (cell / "test_per_task.npz").exists()
  with (
    np.load(cell / "test_scores.npz") as kept,
    np.load(runs["final"] / "test_per_task.npz") as run,
  ):
    assert sorted(kept.files) == ["mse", "nll", "predictive_mean_mse"]
    for name in kept.files:
      np.testing.assert_array_equal(kept[name], run[name])
  entry = zoo.read_manifest(zoo_dir)["cells"]["tiny"]
  assert entry["per_task"].startswith("test_scores.npz: mse, predictive_mean_mse, nll per task")
  (row,) = zoo.verify(zoo_dir, "tiny", 2)
  assert (row.outcome, row.num_tasks) == ("equal", 2), row


def test_compare_equal_within_tolerance_or_different():
  ref = _reference(mse=2.0, mse_ci95=0.4, nll=3.0, nll_ci95=0.2, ece=0.1, mce=0.3)
  same = dict(ref.numbers)
  arrays = {"mse": np.array([1.0, 2.0], np.float32)}
  assert zoo_verify.compare("regression", ref, same, arrays) == ("equal", "")
  # Moved by less than CI_FRACTION of the half-width (0.02 and 0.01), ECE by < 0.002; MCE free.
  near = dict(same, mse=2.0 + 0.019, nll=3.0 - 0.0099, ece=0.1 + 0.0019, mce=0.5)
  outcome, detail = zoo_verify.compare("regression", ref, near, arrays)
  assert (outcome, detail) == ("within tolerance", "mse +0.019, nll -0.0099, ece +0.0019")
  far = dict(near, mse=2.0 + 0.021)
  outcome, detail = zoo_verify.compare("regression", ref, far, arrays)
  assert outcome == "differs" and detail == "mse +0.021 (allowed 0.02, 0.05 x its CI)"
  moved = {"mse": np.array([1.0, 2.0000002], np.float32)}  # one task's last bit
  assert zoo_verify.compare("regression", ref, same, moved)[0] == "within tolerance"
  no_ci = _reference(mse=2.0, nll=3.0)  # one task: no half-width, so nothing is "near"
  assert zoo_verify.compare("regression", no_ci, dict(mse=2.001, nll=3.0), {})[0] == "differs"


def test_within_tolerance_passes_only_where_equality_is_not_expected():
  row = zoo.Verified("c", 4, False, "within tolerance", "mse +1e-07", "a", "b", 1.0)
  assert row.passed
  assert not dataclasses.replace(row, expected_equal=True).passed
  assert dataclasses.replace(row, expected_equal=True, outcome="equal").passed
  assert not dataclasses.replace(row, outcome="differs").passed
  assert not dataclasses.replace(row, outcome="error").passed


def test_the_machine_names_what_changes_the_last_bits(monkeypatch):
  """The device kind, the CPU's identity, jaxlib and XLA's flags, but not the device count."""
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  plain = zoo_verify.this_machine()
  assert plain["platform"] == "cpu" and plain["jaxlib"] == jaxlib.__version__, plain
  assert sorted(plain) == ["cores", "cpu", "cpu_id", "device_kind", "isa", "jaxlib", "platform"]
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert zoo_verify.this_machine() == plain
  monkeypatch.setenv(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=SSE4_2"
  )
  older = zoo_verify.this_machine()
  assert older == dict(plain, xla_flags="--xla_cpu_max_isa=SSE4_2")
  assert zoo_verify.describe_machine(older).endswith(", XLA_FLAGS --xla_cpu_max_isa=SSE4_2")


def test_two_cpu_generations_of_one_model_name_are_two_machines():
  zen3, zen4 = zoo_verify.cpu_identity(ZEN3), zoo_verify.cpu_identity(ZEN4)
  assert zen3["cpu"] == zen4["cpu"] == "AMD EPYC"
  assert zen3["cpu_id"] == "AuthenticAMD family 25 model 1 stepping 1"
  assert zen4["cpu_id"] == "AuthenticAMD family 25 model 17 stepping 1"
  assert zen3["isa"] == "avx avx2 fma sse2"  # what LLVM targets, not every flag
  assert zen4["isa"] == "avx avx2 avx512_bf16 avx512_vnni avx512bw avx512f fma sse2"
  assert zen3 != zen4
  machine = dict(zen4, platform="cpu", device_kind="cpu", jaxlib="0.10.2")
  assert zoo_verify.describe_machine(machine) == (
    f"cpu (AMD EPYC, AuthenticAMD family 25 model 17 stepping 1, AVX-512, {zen4['cores']} "
    "cores), jaxlib 0.10.2"
  )
  old = {"platform": "cpu", "device_kind": "cpu", "cpu": "AMD EPYC", "jaxlib": "0.10.2"}
  assert zoo_verify.describe_machine(old) == "cpu (AMD EPYC), jaxlib 0.10.2"  # older manifests


def test_a_cell_verified_on_one_cpu_passes_within_tolerance_on_another(
  runs, tmp_path, readme, monkeypatch, capsys
):
  """The zoo on a CPU of another generation: a cell verified equal (bit for bit) on the
  machine that trained it, whose numbers come out a few last bits apart here, passes within
  the tolerance; on a machine of the recorded identity it must be equal, and fails; a
  tampered cell fails on both."""
  zoo_dir = _add(runs, tmp_path, "final")
  here = zoo_verify.this_machine()
  zen3 = dict(here, **zoo_verify.cpu_identity(ZEN3))
  assert zen3 != here
  _as_if_computed_elsewhere(zoo_dir, 1 + 1e-6)
  manifest = zoo.read_manifest(zoo_dir)
  manifest["cells"]["tiny"]["verifications"] = [
    {"machine": zen3, "num_tasks": 4, "outcome": "equal", "detail": "", "seconds": 1.0}
  ]
  zoo.write_manifest(zoo_dir, manifest)
  args = ["--zoo", str(zoo_dir), "--readme", str(readme), "verify", "--cells", "tiny"]
  args += ["--num-test-tasks", "all"]

  (row,) = zoo.verify(zoo_dir, "tiny")
  assert (row.expected_equal, row.outcome, row.passed) == (False, "within tolerance", True), row
  assert zoo.main(args) == 0

  monkeypatch.setattr(zoo_verify, "this_machine", lambda: zen3)  # where it was verified equal
  (row,) = zoo.verify(zoo_dir, "tiny")
  assert (row.expected_equal, row.outcome, row.passed) == (True, "within tolerance", False), row
  capsys.readouterr()
  assert zoo.main(args) == 1
  failed = next(line for line in capsys.readouterr().out.splitlines() if "**FAILED**" in line)
  assert "verified equal on a machine of this identity before" in failed
  assert "computes something else" not in failed  # a cause it has not shown

  _as_if_computed_elsewhere(zoo_dir, 1.5)  # tampered: far outside the tolerance
  for machine in (here, zen3):
    monkeypatch.setattr(zoo_verify, "this_machine", lambda machine=machine: machine)
    (row,) = zoo.verify(zoo_dir, "tiny")
    assert (row.outcome, row.passed) == ("differs", False), row
    assert zoo.main(args) == 1


def test_the_tables_are_generated_and_a_stale_one_is_found(runs, tmp_path, readme):
  zoo_dir = _add(runs, tmp_path, "final")
  zoo.write_tables(zoo_dir, readme)
  assert zoo.stale_tables(zoo_dir, readme) == []
  text = readme.read_text()
  assert text.startswith(f"before\n{zoo.TABLE_START}\n\nTrained by a shorter preset")
  assert text.endswith(f"{zoo.TABLE_END}\nafter\n") and "old rows" not in text
  entry = zoo.read_manifest(zoo_dir)["cells"]["tiny"]
  row = next(line for line in text.splitlines() if line.endswith("| `tiny` |"))
  headline = f"MSE {entry['test']['mse']:.3f} ± {entry['test']['mse_ci95']:.3f}"
  assert headline in row and "1.96" not in row  # no paper column beside a short preset
  assert entry["paper"] == "1.96"  # the paper's MAML, in the manifest, not in the row
  zoo_readme = (zoo_dir / "README.md").read_text()
  for path, f in entry["files"].items():
    assert f"| `{path}` | {f['bytes']} | `{f['sha256']}` |" in zoo_readme
  readme.write_text(text.replace(headline, "MSE 1.950 ± 0.100"))
  assert zoo.stale_tables(zoo_dir, readme) == [f"{readme}'s results table"]
  args = ["--zoo", str(zoo_dir), "--readme", str(readme)]
  assert zoo.main(args + ["check"]) == 1
  assert zoo.main(args + ["table"]) == 0 and zoo.main(args + ["check"]) == 0


def test_the_zoo_matches_its_manifest_and_fits_the_budget():
  manifest = zoo.read_manifest(zoo.ZOO)
  assert manifest["cells"], "zoo/manifest.json lists no cell"
  assert zoo.check_cells(zoo.ZOO) == []
  total = sum(entry["bytes"] for entry in manifest["cells"].values())
  assert total <= 30e6, f"the zoo holds {total / 1e6:.1f} MB, over the 30 MB budget"


def test_git_ignores_no_file_of_the_zoo():
  """A clone gets every file the manifest lists (`.gitignore` ignores *.npz elsewhere)."""
  paths = [
    f"zoo/{name}/{path}"
    for name, entry in zoo.read_manifest(zoo.ZOO)["cells"].items()
    for path in entry["files"]
  ]
  done = subprocess.run(
    ["git", "check-ignore", "--no-index", "--stdin"],
    input="\n".join(paths),
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert done.stdout.split() == [], "ignored by .gitignore"


def test_the_readmes_results_table_is_the_zoos():
  assert zoo.stale_tables(zoo.ZOO, REPO / "README.md") == []


def test_every_cell_loads_and_predicts_as_a_run():
  for name, entry in zoo.read_manifest(zoo.ZOO)["cells"].items():
    run = vj.load_run(zoo.ZOO / name)
    assert type(run.config).__name__ in zoo_verify.EXPERIMENT_MODULES, name
    assert run.config.algorithm.name == entry["algorithm"]
    rng = np.random.default_rng(0)
    shape = run.input_shape
    if run.kind == "regression":
      support_y = rng.normal(size=(5, 1)).astype(np.float32)
    else:
      support_y = np.arange(run.config.ways)
    support_x = rng.uniform(-1, 1, (len(support_y), *shape)).astype(np.float32)
    query_x = rng.uniform(-1, 1, (7, *shape)).astype(np.float32)
    predictive = run.predictive(support_x, support_y, query_x, jax.random.key(1))
    value = np.zeros(
      (7, *predictive.event_shape), np.int32 if run.kind != "regression" else np.float32
    )
    assert predictive.batch_shape == (7,) and bool(np.isfinite(predictive.log_prob(value)).all())
    if run.kind == "classification":
      probs = run.predict(support_x, support_y, query_x, jax.random.key(1))
      np.testing.assert_allclose(predictive.probs, probs, atol=1e-6)


def test_a_small_verify_of_the_zoo_passes():
  """What CI runs: one cell, a few tasks, scored again and compared with its run's."""
  (row,) = zoo.verify(zoo.ZOO, "regression_cpu_maml", num_tasks=5)
  assert row.passed and row.num_tasks == 5, row
  if row.expected_equal:  # verified equal on this machine before: it is equal now
    assert row.outcome == "equal", row


def test_verify_refuses_an_unknown_cell_in_one_line():
  with pytest.raises(ConfigError) as error:
    zoo.verify(zoo.ZOO, "no_such_cell*")
  assert _one_line(error).startswith("zoo verify: --cells 'no_such_cell*' names no cell; ")


def test_the_parser_refuses_no_tasks():
  with pytest.raises(SystemExit):
    zoo.parse_args(["verify", "--num-test-tasks", "0"])
  assert isinstance(zoo.parse_args(["verify"]), argparse.Namespace)


def test_verify_scores_twenty_tasks_a_cell_unless_told_all():
  """A plain `verify` finishes in minutes on a CPU (the GPU cell tests 1000 tasks)."""
  assert zoo.parse_args(["verify"]).num_test_tasks == 20
  assert zoo.parse_args(["add", "run"]).num_test_tasks == 20
  assert zoo.parse_args(["verify", "--num-test-tasks", "all"]).num_test_tasks is None
  assert zoo.parse_args(["verify", "--num-test-tasks", "7"]).num_test_tasks == 7
  for bad in ("0", "-3", "some"):
    with pytest.raises(SystemExit):
      zoo.parse_args(["verify", "--num-test-tasks", bad])
