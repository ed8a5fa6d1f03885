"""kernelab: verified, measured Triton kernels for LLM inference, and the instruments that
prove them (verify, bench, inspect, trace, tune, compare).

Importing kernelab patches nothing and compiles nothing.
"""

__version__ = "0.1.0"

from kernelab.ops import rmsnorm, rmsnorm_ref

__all__ = ["__version__", "rmsnorm", "rmsnorm_ref"]
