#!/usr/bin/env bash
# Reproduce docs/results.md: the cpu-scale presets of Tables I-IV (3 seeds each, two simulations at a time on
# 2 cores), their reports, and the loss landscapes of DP-FedAvg vs DP-FedSAM.
#   bash scripts/results_cpu.sh              # sweeps + reports (about an hour on 2 cores)
#   bash scripts/results_cpu.sh --report     # only rebuild the reports from existing multirun/table*/
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
export RAY_TMPDIR="${RAY_TMPDIR:-$(mktemp -d /tmp/ray_results.XXXX)}"
OUT=docs/results

if [ "${1:-}" != "--report" ]; then
  bash scripts/setup.sh
  for table in table4 table1 table2 table3; do
    rm -rf "multirun/$table"
    "$PY" -m apps.main --multirun "+experiment=$table" +scale=cpu +launcher=parallel "hydra.sweep.dir=multirun/$table"
  done
  # SAM is expected to help only with many local epochs (docs/results.md). The ablation preset at E = 10 only (E = 2 is Table IV).
  rm -rf multirun/ablation_epochs_e10
  "$PY" -m apps.main --multirun +experiment=ablation_epochs +scale=cpu +launcher=parallel client.local_epochs=10 \
    hydra.sweep.dir=multirun/ablation_epochs_e10
fi

"$PY" -m fl_app.report multirun/table1 --out "$OUT/table1" --cols split --title "Table I (cpu scale)"
"$PY" -m fl_app.report multirun/table2 --out "$OUT/table2" --cols privacy.target_epsilon --title "Table II (cpu scale)"
"$PY" -m fl_app.report multirun/table3 --out "$OUT/table3" --cols strategy.sparsity --title "Table III (cpu scale)"
"$PY" -m fl_app.report multirun/table4 --out "$OUT/table4" --title "Table IV (cpu scale)"
"$PY" -m fl_app.report multirun/ablation_epochs_e10 --out "$OUT/ablation_epochs_e10" --cols \
  --title "DP-FedAvg vs DP-FedSAM with 10 local epochs (cpu scale)"

# Loss landscapes around the seed-0 Dir-0.6 global models of DP-FedAvg and DP-FedSAM (Table IV's runs).
run_of() {  # the job directory of strategy $1, seed 0, in multirun/table4
  grep -l -x -- "- strategy=$1" multirun/table4/*/.hydra/overrides.yaml | while read -r f; do
    dir="$(dirname "$(dirname "$f")")"
    grep -q -x -- "- seed=0" "$f" && echo "$dir"
  done | head -1
}
"$PY" -m fl_app.landscape "$(run_of dp_fedavg)" "$(run_of dp_fedsam)" --out "$OUT/landscape" \
  --points 11 --span 1.0 --samples 500 --seed 0
