#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv with the project and its dependencies (the version ranges of pyproject.toml), and the Fashion-MNIST data.
# Idempotent: re-running only installs what is missing. Source it or run it; it exits non-zero on failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.dpfedsam-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "[setup] installing the project and its dependencies (first time: torch/torchvision wheels, a few GB)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # torch and torchvision come from the registry together so pip picks a matching pair (see README, Two commands).
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]"
  touch "$stamp"
fi

FMNIST_DIR=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing the Debian package dataset-fashion-mnist"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  elif command -v apt-get >/dev/null 2>&1 && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "[setup] installing the Debian package dataset-fashion-mnist (sudo)"
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    cat >&2 <<MSG
[setup] Fashion-MNIST is missing and apt-get cannot be used here.
        Either install it:   sudo apt-get install dataset-fashion-mnist
        or put the four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
        t10k-labels-idx1-ubyte; .gz or not) into <data_dir>/FashionMNIST/raw/ and run with dataset.data_dir=<data_dir>.
MSG
    exit 1
  fi
fi
echo "[setup] ready: $VENV"
