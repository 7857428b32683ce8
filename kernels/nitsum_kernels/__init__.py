"""Kernels: Triton for CUDA, with a torch reference next to each (used on CPU and in tests)."""
