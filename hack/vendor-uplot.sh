#!/usr/bin/env bash
# Fetches uPlot, the console's plotting library, from npm and copies its
# built files into console/web/vendor/, where the console embeds them. The
# copies are committed, so `make build` and `go test ./...` need no npm; run
# this (make console-vendor) only to move to another version: change
# UPLOT_VERSION and UPLOT_INTEGRITY (from `npm view uplot@VERSION
# dist.integrity`) together, run it, and commit what it changed.
set -euo pipefail
cd "$(dirname "$0")/.."

UPLOT_VERSION=1.6.32
UPLOT_INTEGRITY='sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=='
DEST=console/web/vendor

command -v npm >/dev/null 2>&1 || { echo "vendor-uplot: needs npm (apt-get install npm)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$UPLOT_VERSION" >/dev/null)
tgz="$tmp/uplot-$UPLOT_VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [[ "$got" != "$UPLOT_INTEGRITY" ]]; then
  echo "vendor-uplot: uplot@$UPLOT_VERSION has integrity $got, want $UPLOT_INTEGRITY"; exit 1
fi
tar -xzf "$tgz" -C "$tmp"
mkdir -p "$DEST"
cp "$tmp/package/dist/uPlot.iife.min.js" "$DEST/uPlot.iife.min.js"
cp "$tmp/package/dist/uPlot.min.css" "$DEST/uPlot.min.css"
cp "$tmp/package/LICENSE" "$DEST/uPlot.LICENSE"
{
  echo "uPlot $UPLOT_VERSION from npm ($UPLOT_INTEGRITY), copied by hack/vendor-uplot.sh."
  echo
  for f in uPlot.iife.min.js uPlot.min.css uPlot.LICENSE; do
    echo "$(sha256sum "$DEST/$f" | cut -d' ' -f1)  $f"
  done
} > "$DEST/VENDOR.txt"
echo "vendor-uplot: uplot@$UPLOT_VERSION in $DEST"
