#!/usr/bin/env bash
# Set up and run one node on 127.0.0.1:8000 (embedded mode unless DATABASE_URL/REDIS_URL are set).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh base
echo "==> applying migrations"
.venv/bin/python manage.py migrate --no-input
exec .venv/bin/python manage.py serve --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"
