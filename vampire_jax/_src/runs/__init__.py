"""What a training run is: its config and the experiments' configs, the registry, the
problem, the compiled programs, the loop, the run folder, interrupts, reports and
`load_run`. Imports `core`, `metrics`, `data` and `baselines`."""
