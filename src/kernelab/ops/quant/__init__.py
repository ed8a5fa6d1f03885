"""Quantization of activations: fp8 with per-token or per-tensor scales."""
