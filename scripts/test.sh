#!/usr/bin/env bash
# Set up (if needed) and run the test suite (ruff + pytest; slow-marked tests are left out). Two pytest-xdist workers:
# the integration runs go to one of them, one at a time; the in-process tests share the other (tests/conftest.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export RAY_TMPDIR="${RAY_TMPDIR:-$(mktemp -d /tmp/ray_dpfedsam_test.XXXX)}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
"$ROOT/.venv/bin/ruff" check apps fl_app strategies clients bench tests
exec "$ROOT/.venv/bin/python" -m pytest -m "not slow" -n "${PYTEST_WORKERS:-2}" "$@"
