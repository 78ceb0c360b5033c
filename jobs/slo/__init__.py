"""Service levels: admission of realtime requests from a queueing model, the lanes'
scaling signal, the latency history and what the dashboard shows."""
