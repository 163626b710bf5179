"""Benchmark harness (issue 5): ``python -m bench`` — see bench/run.py and docs/performance.md."""
