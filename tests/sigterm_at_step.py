"""Runs an experiment's command line and sends it SIGTERM right after meta-step N.

    python tests/sigterm_at_step.py N experiments.regression --preset quick ...

The signal is real (the process's own handlers take it, as a `kill` would), only its
moment is fixed, so a test can stop a run between two logged rows and compare the
resumed run's rows with an uninterrupted run's.
"""

import os
import runpy
import signal
import sys

from vampire_jax.runs import reporting

stop_after = int(sys.argv[1])
module = sys.argv[2]
sys.argv = [module] + sys.argv[3:]
advance = reporting.Progress.advance


def advance_then_stop(progress, step: int) -> None:
  advance(progress, step)
  if step == stop_after:
    os.kill(os.getpid(), signal.SIGTERM)


reporting.Progress.advance = advance_then_stop
runpy.run_module(module, run_name="__main__", alter_sys=True)
