"""Benchmark harness: ``python -m bench`` — see bench/run.py and docs/performance.md."""
