"""Gated activations: SiLU or GELU of the gate times the up projection."""
