"""Celery workers: models resident, an engine thread that batches all pending work."""
