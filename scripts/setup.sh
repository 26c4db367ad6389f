#!/usr/bin/env bash
# Installs every system dependency of Encore from Debian 12 packages.
# This is the only place that lists them. Idempotent: safe to run again.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang-14 libclang-rt-14-dev          # libFuzzer + sanitizers for the fuzz target
  clang-format-14                      # the test command checks .clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libxxhash-dev
  libzstd-dev libhiredis-dev redis-server  # session store: compressed snapshots, Redis tier
  haproxy                              # deploy/haproxy.cfg; the cluster test balances 3 replicas
  libboost-dev                         # encore serve: Boost.Asio + Beast (HTTP)
  libcpp-httplib-dev                   # tests: an HTTP client for encore serve
  prometheus                           # promtool: the server's /metrics is checked in a test
  libpcre2-dev libicu-dev             # tokenizer: pre-tokenizer regexes, Unicode NFC/NFD
  libssl-dev                          # libcrypto: SHA-256 (audit log), HMAC-SHA256 (--derive-seed)
  python3
  python3-jinja2                      # tests/jinja: the oracle that encore template is compared with
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# The openai npm client that tests drive `encore serve` with (tests/node,
# pinned by its package-lock.json). Node itself: the machine's, else Debian's.
node_client() {
  cd "$(dirname "$0")/../tests/node"
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  if [ ! -d node_modules/openai ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  fi
}

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  node_client
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
node_client
