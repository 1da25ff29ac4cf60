#!/usr/bin/env bash
# Builds KAI-Scheduler's scheduler, binder, podgrouper and queuecontroller
# from its mirror at KAI_REF into KAI_HOME/bin (NAME-KAI_REF), once: the
# peer runners (kai-topology, kai-scale) share the sources and binaries.
#
#   KAI_REF=72de64fc KAI_HOME=... KAI_GIT=... hack/peers/kai-build.sh
set -euo pipefail
: "${KAI_REF:?}" "${KAI_HOME:?}" "${KAI_GIT:?}"
mkdir -p "$KAI_HOME/bin"
SRC=$KAI_HOME/src-$KAI_REF
if [ ! -d "$SRC" ]; then
  rm -rf "$SRC.tmp"
  mkdir -p "$SRC.tmp" && git --git-dir="$KAI_GIT" archive "$KAI_REF" | tar -x -C "$SRC.tmp" && mv "$SRC.tmp" "$SRC"
fi
for c in scheduler binder podgrouper queuecontroller; do
  if [ ! -x "$KAI_HOME/bin/$c-$KAI_REF" ]; then
    echo "$(date -u +%H:%M:%S) building KAI $c at $KAI_REF"
    (cd "$SRC" && GOFLAGS=-mod=mod go build -o "$KAI_HOME/bin/$c-$KAI_REF" ./cmd/$c)
  fi
done
