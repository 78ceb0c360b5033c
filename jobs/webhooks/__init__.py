"""Webhooks: a project's endpoints, the events of its batches and jobs, their signing and
their delivery from the outbox."""
