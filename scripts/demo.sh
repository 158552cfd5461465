#!/usr/bin/env bash
# The main job end to end on the embedded defaults: warm a built-in model on the CPU into the
# file store, then start a fresh process as a pod would (preload + compile) and compare.
# No cluster, no GPU. Extra arguments go to `compilecache demo` (see --help).
source "$(dirname "$0")/_env.sh"
ensure_venv "store"
cd "$ROOT"
exec "$VENV/bin/compilecache" demo "$@"
