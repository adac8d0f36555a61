"""A GPU-free inference engine that behaves like a vLLM pod.

- `tokenyard.sim.model`: presets (models, GPUs) and the roofline cost of one engine step (pure).
- `tokenyard.sim.tokenizer`: a deterministic word-piece tokenizer (pure).
- `tokenyard.sim.engine`: continuous batching, chunked prefill, paged KV with a prefix cache (pure, time passed in).
- `tokenyard.sim.server`: vLLM's OpenAI-compatible HTTP API and /metrics around one engine (aiohttp adapter).
- `tokenyard.sim.pods`: serves the engine pods of a Kubernetes cluster on their pod IPs.
"""
