"""vampire_jax's implementation of the maths, private: import from `vampire_jax`. Two
layers, each importing only those before it, and nothing public:

  core/      the maths and how it runs: Gaussians over weights, likelihoods, networks,
             the inner loop, learners, the meta-step, task batching and device meshes
  metrics/   calibration, predictive uncertainty, evaluators, the predictive distribution

Above them, public: `vampire_jax.data` and `vampire_jax.baselines`, then the run harness
`vampire_jax.runs`, then the package's top level.
"""
