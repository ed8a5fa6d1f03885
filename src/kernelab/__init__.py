"""kernelab: verified, measured Triton kernels for LLM inference, and the instruments that
prove them (verify, bench, inspect, trace, tune, compare).

``kernelab.kernel`` is ``@triton.jit`` that also runs on CPU tensors, through Triton's
interpreter with kernelab's fixes to it (``kernelab.core.runtime.interpreter``), in any process
and without TRITON_INTERPRET.

Importing kernelab patches nothing and compiles nothing (nor imports torch or Triton).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "kernel", "rmsnorm", "rmsnorm_ref"]


def __getattr__(name: str):
    # These load torch (and Triton); importing them lazily keeps torch-free tools (trace) light.
    if name in ("rmsnorm", "rmsnorm_ref"):
        from kernelab import ops

        return getattr(ops, name)
    if name == "kernel":
        from kernelab.core.runtime.triton import kernel

        return kernel
    raise AttributeError(f"module 'kernelab' has no attribute {name!r}")
