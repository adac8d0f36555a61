"""A GPU-free inference engine that behaves like a vLLM (or SGLang) pod.

- `tokenyard.sim.model`: presets (models, GPUs) and the roofline cost of one engine step (pure).
- the tokenizer is `tokenyard.core.tokenizer`, shared with the router (both cut prompts the same way).
- `tokenyard.sim.engine`: continuous batching, chunked prefill, paged KV with a prefix cache (pure, time passed in).
- `tokenyard.sim.options`: `EngineOptions` (one engine) and `FaultKnobs` (what changes while it runs) (pure).
- `tokenyard.sim.engine_args`: the real engines' command lines (`vllm serve ...`,
  `python3 -m sglang.launch_server ...`) parsed into `EngineOptions` (pure).
- `tokenyard.sim.metrics`: vLLM's or SGLang's Prometheus metrics, and the /metrics encodings.
- `tokenyard.sim.server`: the engine's HTTP API with vLLM's or SGLang's personality (aiohttp adapter).
- `tokenyard.sim.pods`: serves the engine pods of a Kubernetes cluster on their pod IPs.
"""
