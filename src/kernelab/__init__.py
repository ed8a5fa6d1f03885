"""kernelab: verified, measured Triton kernels for LLM inference, and the instruments that
prove them (verify, bench, inspect, trace, tune, compare).

Importing kernelab patches nothing and compiles nothing.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "rmsnorm", "rmsnorm_ref"]


def __getattr__(name: str):
    # The op exports load torch; importing them lazily keeps torch-free tools (trace) light.
    if name in ("rmsnorm", "rmsnorm_ref"):
        from kernelab import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'kernelab' has no attribute {name!r}")
