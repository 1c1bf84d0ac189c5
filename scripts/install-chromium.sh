#!/usr/bin/env bash
# Debian's chromium for the admin browser tests (Playwright drives it), when missing.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Debian's chromium for the admin browser tests"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will fail" >&2
  else
    echo "warning: chromium missing and not root; run: sudo apt-get install chromium" >&2
  fi
fi
