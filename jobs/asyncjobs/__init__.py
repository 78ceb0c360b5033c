"""Single asynchronous requests (``POST /v1/jobs``): durable in PostgreSQL, queued per
version in Redis, answered by the jobs lane."""
