"""The maths and how it runs: weights' Gaussians, likelihoods, networks, the inner loop,
learners, the meta-step, task batching and device meshes. Imports nothing above it."""
