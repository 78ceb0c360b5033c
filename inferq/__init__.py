"""inferq's Python client: ``inferq.client`` (batches from pandas, polars or pyarrow)."""
