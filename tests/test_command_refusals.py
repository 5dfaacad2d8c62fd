"""Commands refuse what they cannot do in one line, before any work.

A regression comparison that names ProtoNet is refused before its first method trains;
`experiments.inner_loop_stability` refuses a folder that is no run, a run of another
experiment or of a learner without gradient inner steps, and a task count below 2;
`benchmarks.simpa_inner_loop` refuses seeds and KL draws it cannot use.
"""

import types

import pytest

import vampire_jax as vj
from benchmarks import simpa_inner_loop, simpa_step_tasks
from experiments import cli, compare, inner_loop_stability, regression, zoo
from vampire_jax._src.core.errors import ConfigError


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _argparse_error(capsys, parse) -> str:
  with pytest.raises(SystemExit) as raised:
    parse()
  assert raised.value.code == 2
  return capsys.readouterr().err.splitlines()[-1]


def test_a_comparison_naming_protonet_is_refused_before_any_method_trains(tmp_path):
  """A regression comparison naming ProtoNet (which classifies) is refused in one line,
  naming the algorithm, why, the experiments it needs and the config it got, before any
  method trains or the comparison's folder is made; the command says it by its flags."""
  trained = []
  experiment = types.SimpleNamespace(
    get_config=regression.get_config,
    run_experiment=lambda config, workdir, progress: trained.append(config.algorithm.name) or {},
  )
  with pytest.raises(ConfigError) as raised:
    compare.run_methods(experiment, ["maml", "protonet"], "quick", tmp_path / "runs", {}, False)
  message = _one_line(raised)
  assert message.startswith(
    "algorithm protonet classifies (its logits are distances to class prototypes): it needs "
  ), message
  assert "a classification experiment's config (omniglot, mini_imagenet, tiered_imagenet)" in (
    message
  )
  assert "not a RegressionConfig" in message
  assert str(cli.as_flags(raised.value)).startswith("--algorithm protonet classifies")
  assert trained == [] and not (tmp_path / "runs").exists()


# -- experiments.inner_loop_stability ---------------------------------------------------------


def test_inner_loop_stability_refuses_a_folder_that_is_no_run(tmp_path):
  """A folder without run.json is refused naming the folder and the run folders to give."""
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(tmp_path / "nothing")])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {tmp_path / 'nothing'} ")
  assert "is not a run folder (no run.json)" in message  # the cause
  assert "give run folders of experiments.regression" in message  # the fix
  assert "e.g. runs/regression_cpu_seed0/vampire" in message


def test_inner_loop_stability_refuses_a_run_of_another_experiment():
  """An Omniglot run is refused naming its config class and that a regression run is needed."""
  cell = zoo.ZOO / "omniglot_original_quick_protonet"
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(cell)])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {cell} ")
  assert "is a run of OmniglotConfig, not of experiments.regression" in message  # the cause
  assert "this tool draws sine/line tasks" in message and "give a regression run" in message


def test_inner_loop_stability_refuses_a_run_without_gradient_inner_steps(tmp_path, monkeypatch):
  """A SImPa run is refused naming its algorithm, the missing gradient inner step, and the
  algorithms that have one, before any task is drawn. A SImPa learner (no inner-loop
  settings) stands in for the trained run: what is refused is the learner's kind."""
  learner = vj.baselines.simpa(
    vj.pure_apply(vj.MLP((4,), 1)), vj.gaussian_nll(0.3), tasks_per_step=2, num_kl_samples=2
  )
  run = types.SimpleNamespace(config=regression.get_config("cpu", "simpa"), learner=learner)
  monkeypatch.setattr(vj, "load_run", lambda folder: run)
  (tmp_path / "run.json").write_text("{}")
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(tmp_path)])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {tmp_path} is a simpa run")
  assert "inner loop has no gradient step of a support loss to measure" in message  # the cause
  assert "give a run of vampire, vampire2, abml, maml, fomaml or platipus" in message  # the fix


@pytest.mark.parametrize("tasks", ["0", "-3", "some"])
def test_inner_loop_stability_refuses_too_few_tasks(capsys, tasks):
  """`--tasks` 0, -3 and 'some' are refused by argparse naming the least count, 2, and why."""
  line = _argparse_error(capsys, lambda: inner_loop_stability.main(["run", "--tasks", tasks]))
  assert line.endswith(
    f"argument --tasks: a count of test tasks of at least 2 (the summary's rank correlation "
    f"needs two), not {tasks!r}"
  )


# -- benchmarks.simpa_inner_loop ----------------------------------------------------------------


@pytest.mark.parametrize(
  "argv, says",
  [
    (["--seeds", "0,a"], "argument --seeds: comma-separated integers >= 0 (e.g. 0,1), not '0,a'"),
    (["--seeds", "-1"], "argument --seeds: comma-separated integers >= 0 (e.g. 0,1), not '-1'"),
    (
      ["--kl-samples", "1"],
      "argument --kl-samples: a count of at least 2 (SImPa's KL estimate needs two draws), not '1'",
    ),
  ],
)
def test_simpa_inner_loop_refuses_what_it_cannot_use(capsys, argv, says):
  """Bad `--seeds` and `--kl-samples` 1 are refused by argparse, naming the form or the least
  count and the value given, before any data is built."""
  assert _argparse_error(capsys, lambda: simpa_inner_loop.main(argv)).endswith(says)


@pytest.mark.parametrize(
  "argv, says",
  [
    (
      ["--stop", "3", "--kl-samples", "1"],
      "argument --kl-samples: a count of at least 2 (SImPa's KL estimate needs two draws), not '1'",
    ),
    (["--stop", "-1"], "argument --stop: a count of at least 0 (the meta-steps to run before"),
  ],
)
def test_simpa_step_tasks_refuses_what_it_cannot_use(capsys, argv, says):
  """Refused in one line before any data are built."""
  assert says in _argparse_error(capsys, lambda: simpa_step_tasks.main(argv))
