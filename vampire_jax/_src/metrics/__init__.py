"""Scores of a learner: calibration, predictive uncertainty, the evaluators, the
predictive distribution. Imports `core` only."""
