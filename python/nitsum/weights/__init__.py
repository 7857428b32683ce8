"""Model weight loading: HF safetensors directories and GGUF files.

- :mod:`nitsum.weights.hf` reads an HF directory (``config.json`` + ``*.safetensors``).
- :mod:`nitsum.weights.gguf` reads a llama-architecture GGUF into HF names and layout.
- :mod:`nitsum.weights.prepare` turns a GGUF into an HF directory once (``nitsum model prepare``)
  and resolves the ``--model`` argument to such a directory.
"""
