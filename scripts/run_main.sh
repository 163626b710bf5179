#!/usr/bin/env bash
# Set up (if needed) and run the main job: DP-FedSAM on Fashion-MNIST (default config, conf/config.yaml).
# Extra arguments are Hydra overrides, e.g.  bash scripts/run_main.sh num_rounds=5 strategy=dp_fedavg
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export RAY_TMPDIR="${RAY_TMPDIR:-$(mktemp -d /tmp/ray_dpfedsam.XXXX)}"
exec "$ROOT/.venv/bin/python" -m apps.main "$@"
