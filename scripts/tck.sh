#!/usr/bin/env bash
# The official A2A TCK (github.com/a2aproject/a2a-tck) against an a2a-sdk agent, directly and
# through a node, per binding (JSON-RPC, HTTP+JSON, gRPC): bench/tck_run.py; the summary goes to
# bench/results/tck-<time>.json. Not part of the test suite.
#
#   scripts/tck.sh [--bindings jsonrpc,rest,grpc] [--categories mandatory,capabilities]
#
# The TCK: TCK_DIR (a checkout; default .tck/a2a-tck), cloned when missing from
# TCK_GIT (a URL or a local mirror/bare repository; default the GitHub repository) at
# TCK_REF when set. Its own virtualenv: TCK_VENV (default .tck/venv), made once with
# the TCK's requirements from the package index pip is configured with; with both in place
# the run needs no network.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TCK_DIR=${TCK_DIR:-$ROOT/.tck/a2a-tck}
TCK_VENV=${TCK_VENV:-$ROOT/.tck/venv}
TCK_GIT=${TCK_GIT:-https://github.com/a2aproject/a2a-tck}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}

if [ ! -f "$TCK_DIR/run_tck.py" ]; then
    mkdir -p "$(dirname "$TCK_DIR")"
    git clone --quiet "$TCK_GIT" "$TCK_DIR"
    if [ -n "${TCK_REF:-}" ]; then
        git -C "$TCK_DIR" checkout --quiet "$TCK_REF"
    fi
fi
if [ ! -x "$TCK_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$TCK_VENV"
    "$TCK_VENV/bin/python" -m pip install --quiet -r "$TCK_DIR/requirements.txt" \
        pytest-json-report python-dotenv grpcio-status proto-plus pyOpenSSL aiohttp
fi
cd "$ROOT"
exec "$PYTHON" bench/tck_run.py --tck-dir "$TCK_DIR" --tck-python "$TCK_VENV/bin/python" "$@"
