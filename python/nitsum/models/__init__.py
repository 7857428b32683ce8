"""Llama-family decoders with TP-agnostic fused weights."""
