"""The command line: bad input is refused before anything expensive, in one line with exit
code 2 and no traceback; `--help` gives every flag a description and the preset's default."""

import dataclasses
import re
import shutil
import time

import pytest

import vampire_jax as vj
from conftest import OMNIGLOT_DIR, needs_omniglot
from experiments import cli, omniglot
from experiments.presets import OmniglotConfig
from vampire_jax.runs.run_config import PARTS
from vampire_jax.runs.interrupts import TrainingInterrupted


def _run(argv, capsys):
  start = time.perf_counter()
  code = cli.main_entry(omniglot.main, argv + ["--no-compilation-cache"])
  out = capsys.readouterr()
  return code, out.out + out.err, time.perf_counter() - start


BAD_FLAGS = [  # (flags, what the one-line message must name)
  (["--num-meta-steps", "-5"], "--num-meta-steps must be an integer >= 1, got -5"),
  (["--inner-lr", "nan"], "--inner-lr must be a finite number > 0, got nan"),
  (["--meta-lr", "0"], "--meta-lr must be a finite number > 0"),
  (["--kl-weight", "-1"], "--kl-weight must be a finite number >= 0"),
  (
    ["--ways", "5000"],
    "--ways 5000: a 5000-way task needs 5000 distinct classes, but the "
    "original split's val part has only 151",
  ),
  (
    ["--shots", "10", "--query", "15"],
    "--shots 10, --query 15: each class needs --shots + --query = 25 distinct examples, but "
    "has only 20",
  ),
  (["--log-std-init", "-3", "-4"], "--log-std-init must be two finite numbers LOW <= HIGH"),
  (["--tasks-per-step", "0"], "--tasks-per-step must be an integer >= 1"),
]


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[f[0][0] for f in BAD_FLAGS])
def test_bad_flags_exit_2_with_one_line_before_any_work(flags, message, tmp_path, capsys):
  workdir = tmp_path / "run"
  code, output, seconds = _run(["--preset", "quick", "--workdir", str(workdir)] + flags, capsys)
  assert code == 2, output
  assert f"error: {message}" in output
  assert "Traceback" not in output
  assert not workdir.exists()  # the run folder is created only for a valid config
  assert seconds < 10  # before loading data or compiling anything


@needs_omniglot
def test_data_problems_exit_2_naming_the_file(tmp_path, capsys, monkeypatch, omniglot_cache):
  # A named data folder that is empty, while a cache exists: an error, not the cache.
  empty = tmp_path / "empty"
  empty.mkdir()
  monkeypatch.setenv("OMNIGLOT_DIR", str(empty))
  code, output, _ = _run(
    ["--preset", "quick", "--workdir", str(tmp_path / "a"), "--cache-dir", str(omniglot_cache)],
    capsys,
  )
  assert code == 2 and "not found in the Omniglot folder" in output and str(empty) in output
  assert "Traceback" not in output and not (tmp_path / "a").exists()
  # A truncated zip: the message names the file.
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "images_background.zip").write_bytes(
    (OMNIGLOT_DIR / "images_background.zip").read_bytes()[:100_000]
  )
  shutil.copy(OMNIGLOT_DIR / "images_evaluation.zip", broken)
  monkeypatch.setenv("OMNIGLOT_DIR", str(broken))
  code, output, _ = _run(
    ["--preset", "quick", "--workdir", str(tmp_path / "b"), "--cache-dir", str(tmp_path / "cache")],
    capsys,
  )
  assert code == 2 and "images_background.zip is not a readable zip file" in output, output
  assert "Traceback" not in output and not (tmp_path / "cache" / "omniglot28.npz").exists()


@needs_omniglot
def test_resuming_with_another_config_is_refused_naming_the_fields(tiny_omniglot_run, capsys):
  workdir = tiny_omniglot_run[0]
  before = sorted(p.name for p in workdir.iterdir())
  code, output, _ = _run(
    [
      "--preset",
      "quick",
      "--workdir",
      str(workdir),
      "--ways",
      "20",
      "--algorithm",
      "maml",
      "--num-filters",
      "64",
    ],
    capsys,
  )
  assert code == 2 and "holds a run with another config" in output
  for field in ("--algorithm: 'vampire' -> 'maml'", "--ways: 5 -> 20", "--num-filters: 8 -> 64"):
    assert field in output
  assert "Traceback" not in output
  assert sorted(p.name for p in workdir.iterdir()) == before  # nothing written


def test_an_interrupted_run_says_how_to_resume_and_exits_128_plus_the_signal(tmp_path, capsys):
  def stopped(argv):
    raise TrainingInterrupted(40, 15, tmp_path)

  assert cli.main_entry(stopped, ["--no-compilation-cache"]) == 143
  assert "SIGTERM: stopped at step 40" in capsys.readouterr().err


def _every_field(config_class) -> list[dataclasses.Field]:
  """The fields a command line has flags for: the config's own (not its parts nor its
  algorithm), its parts' and every registered algorithm's spec's."""
  fields = [f for f in dataclasses.fields(config_class) if f.name not in ("algorithm", *PARTS)]
  for part in (vj.Schedule, vj.Evaluation, vj.Speed, *vj.specs.SPECS.values()):
    fields += dataclasses.fields(part)
  return fields


def test_help_describes_every_flag_with_the_presets_default(capsys):
  with pytest.raises(SystemExit):
    omniglot.main(["--preset", "20way1shot", "--algorithm", "maml", "--help"])
  text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
  for field in _every_field(OmniglotConfig):
    flag = cli.flag(field.name)
    assert flag in text, flag
    assert field.metadata["help"].split()[0] in text, field.name
  # The defaults shown are the chosen preset's, for the chosen algorithm.
  assert "N, classes per task (default: 20)" in text
  assert "T, tasks per meta-update (default: 16)" in text
  # MAML has no KL weight: the flag says which algorithms take it.
  assert "against the mean NLL (an option of vampire, platipus, abml, vampire2)" in text


def test_help_groups_every_flag_and_says_each_default_once(capsys):
  from vampire_jax.runs import experiment_configs as configs

  for config_class in (
    configs.OmniglotConfig,
    configs.MiniImagenetConfig,
    configs.FeaturesConfig,
    configs.RegressionConfig,
  ):
    unplaced = [
      f.name
      for f in _every_field(config_class)
      if not any(f.name in g for g in cli.GROUPS.values())
    ]
    assert unplaced == [], f"{config_class.__name__}: give these fields a --help group"
  with pytest.raises(SystemExit):
    omniglot.main(["--help"])
  out = capsys.readouterr().out
  # The groups, in order, each with its own flags.
  titles = [
    line
    for line in out.splitlines()
    if line and not line.startswith(" ") and line.endswith(":") and line.split(":")[0] in cli.GROUPS
  ]
  assert [t.split(":")[0] for t in titles] == list(cli.GROUPS)
  sections = dict(zip(cli.GROUPS, out.split("\n\n")[-len(cli.GROUPS) :]))
  for group, flags in {
    "run": ["--preset", "--workdir", "--num-meta-steps", "--seed"],
    "algorithm": ["--algorithm", "--inner-lr", "--kl-weight"],
    "task": ["--ways", "--shots", "--num-filters"],
    "data": ["--data-dir", "--split", "--cache-dir"],
    "speed": ["--task-batching", "--remat", "--conv-impl"],
    "evaluation": ["--num-mc-test", "--num-test-tasks", "--num-bins"],
  }.items():
    assert sections[group].startswith(group + ":"), sections[group][:40]
    for flag in flags:
      assert re.search(rf"^  {flag}\b", sections[group], re.MULTILINE), (group, flag)
  # Each flag's help says its default once: no "(default: None)" after a text that
  # explains the default, no "0: off" twice.
  entries = " ".join(out.split()).split(" --")
  assert [e for e in entries if e.count("default:") > 1] == []
  assert [e for e in entries if "(default: None)" in e] == []
  assert [e for e in entries if e.count("off") > 1] == []
