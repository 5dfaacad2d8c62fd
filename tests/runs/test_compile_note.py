import threading
import time

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import zoo
from vampire_jax.runs import compile_note


@pytest.fixture
def fresh_process(monkeypatch):
  """compile_note as in a process that has predicted nothing yet, noting after 0.05 s."""
  monkeypatch.setattr(compile_note, "_first_call", threading.Event())
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 0.05)


def test_a_slow_first_prediction_says_it_is_compiling_once(fresh_process, capsys):
  slow = lambda x: time.sleep(0.3) or x  # noqa: E731
  assert compile_note.noting_a_slow_first_call(slow, 1) == 1
  assert capsys.readouterr().err == compile_note.NOTE + "\n"
  assert compile_note.noting_a_slow_first_call(slow, 2) == 2  # once per process
  assert capsys.readouterr().err == ""


def test_a_quick_first_prediction_says_nothing(fresh_process, monkeypatch, capsys):
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 2.0)
  assert compile_note.noting_a_slow_first_call(lambda: 7) == 7
  time.sleep(0.05)
  assert capsys.readouterr().err == ""


def test_run_predict_goes_through_the_note(fresh_process, monkeypatch, capsys):
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 0.0)  # whatever the call takes
  run = vj.load_run(zoo.ZOO / "regression_cpu_maml")
  x = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]
  assert run.predict(x, np.sin(x), x, jax.random.key(0)).shape == (1, 5, 1)
  assert compile_note.NOTE in capsys.readouterr().err
