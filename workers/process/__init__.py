"""A model-serving process: its dependencies, heartbeat, metrics, circuit breaker and the
fork server that starts it warm."""
