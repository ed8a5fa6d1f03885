"""Normalisation: RMSNorm, LayerNorm, and RMSNorm with fp8 quantization, one kernel."""
