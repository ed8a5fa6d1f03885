"""Flawed kernels that verify must catch, each with the failure class it must name.

Triton flaws are planted in the real RMSNorm kernel's source (tests/mutants.py) and launched
through the real launcher, on CPU through the interpreter; PyTorch flaws are plain functions
with RMSNorm's signature.
"""
