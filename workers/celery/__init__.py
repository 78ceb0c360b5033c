"""The worker's Celery app and its tasks: thin, named, each a call of a plain function."""
