#!/usr/bin/env bash
# Create .venv (if missing) and install a requirement set into it: setup.sh base|dev
set -euo pipefail
cd "$(dirname "$0")/.."
set_name="${1:-base}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating virtualenv .venv"
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$set_name"
if [ ! -f "$stamp" ] || [ "requirements/$set_name.txt" -nt "$stamp" ] || [ requirements/base.txt -nt "$stamp" ]; then
  echo "==> installing requirements/$set_name.txt"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "requirements/$set_name.txt"
  touch "$stamp"
fi
