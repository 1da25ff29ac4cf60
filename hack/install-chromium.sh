#!/usr/bin/env bash
# Installs Debian's chromium, the headless browser of the console's
# end-to-end tests (e2e/console_test.go drives it with chromedp). Idempotent:
# it does nothing when a chromium is already on PATH, and `make test` and
# .ci/run call it every time. PARTITA_CHROMIUM names another binary to use.
set -euo pipefail

if [[ -n "${PARTITA_CHROMIUM:-}" ]]; then
  command -v "$PARTITA_CHROMIUM" >/dev/null 2>&1 || { echo "install-chromium: PARTITA_CHROMIUM=$PARTITA_CHROMIUM is not an executable"; exit 1; }
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no chromium on PATH and no apt-get to install it; install Chromium (or Chrome) and set PARTITA_CHROMIUM to its path"
  exit 1
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-chromium: installing chromium needs root (or sudo)"; exit 1; }
  sudo="sudo"
fi
echo "install-chromium: installing Debian's chromium (for the console's browser tests)"
# The lock makes concurrent callers (several worktrees' tests) wait for one
# another instead of failing on dpkg's lock.
$sudo flock /tmp/partita-apt.lock bash -c 'command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }'
command -v chromium >/dev/null 2>&1 || { echo "install-chromium: apt-get ran, but chromium is still not on PATH"; exit 1; }
