"""The lanes a worker serves: realtime (Redis), jobs (Redis), batch and flex shards
(Celery) and control (janitor, webhook deliveries)."""
