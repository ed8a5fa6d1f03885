"""The workload instruments: what a model costs before it runs (``model_cost``, from a
config parsed by ``model_config``; checked against a profile by ``cost_check``), and what it
does when it runs, original against patched: ``model_bench`` (prefill latency, decode tokens
per second), ``serve_bench`` (transformers' continuous batching on a paged cache) and
``profile`` (one decode step under the PyTorch profiler). They build on the Hugging Face
integration in :mod:`kernelab.models` (patching, attention registration, presets), never the
other way round.
"""
