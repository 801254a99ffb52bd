#!/usr/bin/env bash
# Node.js 20 or later and npm, installed when missing or older (see
# ensure_node in lib.sh): what `make sdk-pack` needs on a machine that
# `make run` alone set up.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
ensure_node
