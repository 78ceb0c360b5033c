"""The realtime lane, API side: requests queued for the workers in Redis and their
answers and token streams."""
