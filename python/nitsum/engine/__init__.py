"""Iteration-level engine: sequences, local scheduler, step inputs, runner."""
