#!/usr/bin/env bash
# Create .venv (if missing) and install a requirement set into it: setup.sh base|dev
# dev also installs the JavaScript clients the tests drive (tests/js: the MCP Inspector).
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
if [ "$set_name" = dev ]; then
  # Pinned by tests/js/package-lock.json; installed here, never at test time (the tests that
  # need it skip without it, and fail under CI=true).
  js_stamp="tests/js/node_modules/.installed"
  if [ ! -f "$js_stamp" ] || [ tests/js/package-lock.json -nt "$js_stamp" ]; then
    if command -v npm >/dev/null 2>&1; then
      echo "==> installing tests/js/package-lock.json (the MCP Inspector)"
      npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
      touch "$js_stamp"
    else
      echo "warning: npm missing: the MCP Inspector tests skip (fail under CI=true)" >&2
    fi
  fi
fi
