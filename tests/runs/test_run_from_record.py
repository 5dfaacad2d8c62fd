"""Run folders written before the modules moved: their records name
`vampire_jax.configs.<Class>` and `vampire_jax.models.<Class>`, in `run.json` and in every
checkpoint, and do not record `x64` (a float32 run). They load and resume, silently and
with the same numbers."""

import json
import warnings

import pytest

import vampire_jax as vj
from experiments import regression
from tests.conftest import tiny_regression_config
from vampire_jax._src.core import models
from vampire_jax._src.core.errors import RunFolderError
from vampire_jax.runs.experiment_configs import RegressionConfig
from vampire_jax.runs.run_folder import record as record_module

QUIET = dict(progress=False, print_fn=lambda message: None)


OLD_CONFIG_CLASS = "vampire_jax.configs.RegressionConfig"


OLD_MODEL_CLASS = "vampire_jax.models.MLP"


def _as_written_by_0_2_0(record: dict) -> dict:
  """`record` as 0.2.0 wrote it: the old class paths, and no `x64` (recorded since issue 49)."""
  return dict(
    {name: value for name, value in record.items() if name != "x64"},
    config_class=OLD_CONFIG_CLASS,
    model=dict(record["model"], **{"class": OLD_MODEL_CLASS}),
  )


def _write_old_names(workdir, monkeypatch):
  """`run.json` and the checkpoints' records with the class paths of 0.2.0."""
  path = workdir / "run.json"
  path.write_text(json.dumps(_as_written_by_0_2_0(json.loads(path.read_text()))))
  real = record_module._step_metadata

  def carried(folder, step):
    metadata = real(folder, step)
    if metadata.get("record"):
      metadata = dict(metadata, record=_as_written_by_0_2_0(metadata["record"]))
    return metadata

  monkeypatch.setattr(record_module, "_step_metadata", carried)


def test_an_earlier_versions_run_folder_loads_and_resumes_with_the_same_numbers(
  tmp_path, monkeypatch
):
  config = tiny_regression_config(num_meta_steps=4)
  old, fresh = tmp_path / "old", tmp_path / "fresh"
  for workdir in (old, fresh):
    regression.run_experiment(config, workdir, **QUIET)
  _write_old_names(old, monkeypatch)
  longer = config.replace(num_meta_steps=6)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run = vj.load_run(old)
    resumed = regression.run_experiment(longer, old, **QUIET)
  assert [str(w.message) for w in caught if "vampire_jax" in str(w.message)] == []
  assert type(run.config) is RegressionConfig and type(run.model) is models.MLP
  assert resumed["resumed_from_step"] == 4 and resumed["meta_steps"] == 6
  # The same numbers as the run that never carried the old names.
  monkeypatch.undo()
  expected = regression.run_experiment(longer, fresh, **QUIET)
  assert resumed["test"] == expected["test"]


def test_an_old_name_is_still_checked_against_what_was_trained(tmp_path, monkeypatch):
  config = tiny_regression_config(num_meta_steps=2)
  regression.run_experiment(config, tmp_path, **QUIET)
  _write_old_names(tmp_path, monkeypatch)
  path = tmp_path / "run.json"
  record = json.loads(path.read_text())
  record["model"]["fields"]["hidden_sizes"] = [4, 4]  # edited after training
  path.write_text(json.dumps(record))
  with pytest.raises(RunFolderError, match="disagrees with the record its checkpoints carry"):
    vj.load_run(tmp_path)


def test_an_old_model_spec_builds_todays_class_without_a_warning():
  spec = {"class": OLD_MODEL_CLASS, "fields": {"hidden_sizes": [8, 8], "num_outputs": 1}}
  with warnings.catch_warnings():
    warnings.simplefilter("error", FutureWarning)
    model = models.module_from_spec(spec)
  assert type(model) is models.MLP and model.hidden_sizes == (8, 8)
