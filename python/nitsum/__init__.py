"""Nitsum: LLM serving with tensor parallelism as a runtime control knob."""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> object:
    # Lazy, so `import nitsum.bench` or the worker do not pay for the engine imports.
    if name == "LLM":
        from nitsum.llm import LLM

        return LLM
    if name == "SamplingParams":
        from nitsum.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)
