"""inferq's own generation engine over a transformers model (``engine.GenerationEngine``):
continuous batching scheduled per decode step."""
