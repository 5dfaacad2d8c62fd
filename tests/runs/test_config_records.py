"""A run's config as `run.json` records it (`config_records`), and the one reader of the
flat format written before the algorithm specs."""

import gzip
import json
from pathlib import Path

import pytest

import vampire_jax as vj
from experiments import presets, regression
from tests.conftest import (
  REPO,
)
from tests.helpers import ROOT, _tiny_config
from vampire_jax._src.core import models
from vampire_jax.runs import (
  config_records,
  experiment_configs,
  run_config,
  run_folder,
)

# Every preset of every experiment for every algorithm, as the flat `RunConfig` of 249503e
# recorded it (`dataclasses.asdict`): 133 configs.
FLAT_PRESETS = json.loads(
  gzip.open(
    Path(__file__).parents[1] / "fixtures" / "flat_preset_configs_249503e.json.gz", "rt"
  ).read()
)


def test_a_run_recorded_before_the_field_pads_as_it_did():
  # A zoo cell's run.json (its config recorded flat, the old format) has no `padding` in its
  # network nor `conv_padding` in its config: it is rebuilt with XLA's padding, and the
  # command's config equals its record there.
  record = json.loads((ROOT / "zoo/omniglot_original_quick_vampire/run.json").read_text())
  assert "padding" not in record["model"]["fields"]
  assert "conv_padding" not in record["config"]
  assert models.module_from_spec(record["model"]).padding == "same"
  config = presets.omniglot_config("quick").replace(
    **{k: v for k, v in record["config"].items() if k in ("seed",)},
  )
  saved = config_records.flat(record["config"])
  assert "conv_padding" not in run_config.config_differences(saved, config)


def test_a_field_added_since_the_run_was_recorded_counts_as_its_default():
  """Runs recorded before a config field existed resume with its default, and only with it."""
  from vampire_jax.runs import experiment_configs as configs
  from vampire_jax.runs import run_config as config_lib

  current = configs.OmniglotConfig()
  saved = config_lib.jsonable(current.flat())
  del saved["num_val_alphabets"]
  assert config_lib.config_differences(saved, current) == {}
  changed = current.replace(num_val_alphabets=0)
  assert config_lib.config_differences(saved, changed) == {"num_val_alphabets": (5, 0)}


def test_an_older_run_that_recorded_an_ignored_setting_still_resumes(tmp_path):
  """A run.json of the flat format (before the specs), whose MAML run recorded another
  algorithm's option (kl_weight 0.5), resumes with today's MAML config: the option is left
  behind when the record is read."""
  from vampire_jax.runs.config_records import OLD_NAMES

  config = _tiny_config().replace(algorithm="maml")
  results = regression.run_experiment(config, tmp_path, progress=False, print_fn=print)
  record = json.loads((tmp_path / "run.json").read_text())
  new_names = {new: old for old, new in OLD_NAMES.items()}
  record["config"] = {new_names.get(name, name): value for name, value in config.flat().items()}
  record["config"]["kl_weight"] = 0.5  # an option MAML never read, in a flat record
  del record["format"]
  (tmp_path / "run.json").write_text(json.dumps(record))
  run_folder.check_resumable(tmp_path, config.replace(num_meta_steps=6))
  assert results["meta_steps"] == 4


def test_the_flat_format_reads_as_todays_presets():
  """Each preset, read from its flat record, is the preset today's code builds: the old
  format's fields reach their parts and specs, and the presets did not change."""
  assert len(FLAT_PRESETS) == 133
  for key, recorded in FLAT_PRESETS.items():
    experiment, preset, algorithm = key.split("/")
    cls = getattr(experiment_configs, recorded["class"])
    read = config_records.from_record(recorded["config"], cls)
    assert read == presets.get_config(experiment, preset, algorithm), key


def test_the_flat_format_leaves_behind_what_the_algorithm_never_read():
  recorded = FLAT_PRESETS["regression/cpu/maml"]["config"]
  assert (recorded["kl_weight"], recorded["num_mc_test"]) == (0.0, 1)  # neutral, unread
  flat = config_records.flat(recorded)
  assert "kl_weight" not in flat and "num_mc_test" not in flat
  assert flat["inner_lr"] == recorded["inner_lr"]
  renamed = config_records.flat(FLAT_PRESETS["omniglot/quick/simpa"]["config"])
  assert renamed["num_kl_samples"] == 512 and "simpa_kl_samples" not in renamed


@pytest.mark.parametrize("key", ["omniglot/quick/protonet", "regression/authors2019/bmaml"])
def test_a_record_reads_back_as_the_config_it_records(key):
  config = presets.get_config(*key.split("/"))
  recorded = json.loads(json.dumps(config_records.to_record(config)))
  assert recorded["algorithm"]["name"] == config.algorithm.name
  assert config_records.from_record(recorded, type(config)) == config
  assert config_records.flat(recorded) == json.loads(json.dumps(config.flat()))


def test_every_kept_run_folder_reads_its_config_by_parts():
  folders = [p for base in ("zoo", "training") for p in (REPO / base).iterdir() if p.is_dir()]
  assert len(folders) >= 9
  formats = set()
  for folder in folders:
    record = json.loads((folder / "run.json").read_text())
    old = config_records.is_old_format(record["config"])
    formats.add("flat, before the specs" if old else "by parts")
    run = vj.load_run(folder)
    algorithm = record["config"]["algorithm"]
    assert run.config.algorithm.name == (algorithm if old else algorithm["name"])
    assert config_records.flat(record["config"])["seed"] == run.config.seed
  assert formats == {"flat, before the specs", "by parts"}  # both read


def test_a_spec_that_does_not_import_is_refused_with_the_way_to_pass_it():
  recorded = config_records.to_record(vj.RunConfig())
  recorded["algorithm"]["spec"] = "__main__.Mine"
  recorded["algorithm"]["name"] = "mine"
  with pytest.raises(vj.RunFolderError, match=r"algorithm=Mine"):
    config_records.from_record(recorded, vj.RunConfig)
  read = config_records.from_record(recorded, vj.RunConfig, algorithm=vj.specs.Vampire)
  assert read == vj.RunConfig()
