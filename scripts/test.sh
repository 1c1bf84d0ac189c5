#!/usr/bin/env bash
# Set up and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Debian's chromium for the admin browser tests"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will fail" >&2
  else
    echo "warning: chromium missing and not root; run: sudo apt-get install chromium" >&2
  fi
fi
mkdir -p test-artifacts
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
