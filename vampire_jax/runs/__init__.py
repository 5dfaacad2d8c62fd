"""The run harness, a public layer above `data` and `baselines`: what a training run is.

Its config (`run_config`: `RunConfig` of parts; `specs`: one spec per algorithm) and the
experiments' configs (`experiment_configs`), the problem (`problem`), the compiled programs
(`programs`), the loop (`loop`), the run folder (`run_folder`, `config_records`),
interrupts, reports, recalibration and loading a trained run (`trained_run`). The top-level
`vampire_jax` re-exports its entry points (`vj.RunConfig`, `vj.train_and_evaluate`,
`vj.load_run`, ...); the experiments use its modules directly.
"""

from vampire_jax.runs.trained_run import Run, load_run  # noqa: F401 (0.2.0's vampire_jax.runs)
