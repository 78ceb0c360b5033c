"""The service's foundations, used by every context: settings, the handles of a use case, errors,
lifecycles, the schema and its queries, logs, traces, the queues and idempotency keys."""
