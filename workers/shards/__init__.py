"""Batch shards on a worker: claimed, read in chunks, run, written and checkpointed."""
