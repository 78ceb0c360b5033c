"""Adapters to the outside world: database, object store, Parquet. No business rules."""
