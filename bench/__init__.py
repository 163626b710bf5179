"""Benchmark harness: ``python -m bench`` — see bench/run.py and docs/performance.md.

The benchmarks compose the project's configs, whose strategies are looked up by name: importing the registry here
registers them (strategies/registry.py) before any bench module validates a config.
"""

import strategies.registry  # noqa: F401
