"""vampire_jax's implementation, private: import from `vampire_jax` (or `vampire_jax.data`,
`vampire_jax.baselines`). Three layers, each importing only those before it:

  core/      the maths and how it runs: Gaussians over weights, likelihoods, networks,
             the inner loop, learners, the meta-step, task batching and device meshes
  metrics/   calibration, predictive uncertainty, evaluators, the predictive distribution
  runs/      what a training run is: configs, the registry, the loop, the run folder,
             interrupts, reports, loading a trained run
"""
