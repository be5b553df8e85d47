"""Benchmark orchestration for sluice: peers, processes, scenarios and the report (stdlib only)."""
