"""Readers of real profiler traces, joined to workload graphs for validation."""
