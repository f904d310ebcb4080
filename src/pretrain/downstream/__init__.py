"""Downstream evaluation: lm-evaluation-harness on checkpoints, and the project's offline tasks."""
