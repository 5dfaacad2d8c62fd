"""A run's config as `run.json` records it (`config_records`), and the one reader of the
flat format written before the algorithm specs."""

import gzip
import json
from pathlib import Path

import pytest
from conftest import REPO

import vampire_jax as vj
from experiments import presets
from vampire_jax.runs import config_records, experiment_configs

# Every preset of every experiment for every algorithm, as the flat `RunConfig` of 249503e
# recorded it (`dataclasses.asdict`): 133 configs.
FLAT_PRESETS = json.loads(
  gzip.open(Path(__file__).parent / "fixtures" / "flat_preset_configs_249503e.json.gz", "rt").read()
)


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
  for folder in folders:
    record = json.loads((folder / "run.json").read_text())
    assert config_records.is_old_format(record["config"])  # written before the specs
    run = vj.load_run(folder)
    assert run.config.algorithm.name == record["config"]["algorithm"]
    assert config_records.flat(record["config"])["seed"] == run.config.seed


def test_a_spec_that_does_not_import_is_refused_with_the_way_to_pass_it():
  recorded = config_records.to_record(vj.RunConfig())
  recorded["algorithm"]["spec"] = "__main__.Mine"
  recorded["algorithm"]["name"] = "mine"
  with pytest.raises(vj.RunFolderError, match=r"algorithm=Mine"):
    config_records.from_record(recorded, vj.RunConfig)
  read = config_records.from_record(recorded, vj.RunConfig, algorithm=vj.specs.Vampire)
  assert read == vj.RunConfig()
