"""Checkpoints: find the default model, load uploads safely, run a model and capture its attention."""
