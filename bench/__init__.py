"""Benchmarks and the demo: workloads from fixed seeds, tables printed, JSON written."""
