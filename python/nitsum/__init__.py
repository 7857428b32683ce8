"""Nitsum: LLM serving with tensor parallelism as a runtime control knob."""

__version__ = "0.1.0"
