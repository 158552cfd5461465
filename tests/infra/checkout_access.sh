#!/usr/bin/env bash
# Check up front that other uids can read this checkout and the test venv: the end-to-end tests run
# processes and containers as other users (65532, 1000, ...), which import cachelib from here.
# Usage: tests/infra/checkout_access.sh [EXTRA_DIR...]; exits 1 with one line saying what to do.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ "$(id -u)" == 0 ]] || exit 0  # only root runs processes as other uids
for path in "$root/cachelib/__init__.py" "$@"; do
    [[ -e "$path" ]] || continue
    if ! setpriv --reuid=65534 --regid=65534 --clear-groups -- test -r "$path"; then
        dir="$path"
        while [[ "$dir" != / ]]; do
            dir="$(dirname "$dir")"
            setpriv --reuid=65534 --regid=65534 --clear-groups -- test -x "$dir" || blocked="$dir"
        done
        echo "error: other users cannot read $path (${blocked:+$blocked is mode $(stat -c %a "$blocked"); }the tests run processes as other uids): clone into a directory others can traverse (e.g. /srv/compilecache) or run: chmod o+x ${blocked:-<its parents>}" >&2
        exit 1
    fi
done
