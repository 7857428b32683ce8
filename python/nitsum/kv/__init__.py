"""Paged KV cache."""
