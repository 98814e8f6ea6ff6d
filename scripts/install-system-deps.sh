#!/usr/bin/env bash
# Install the Debian packages the tests need (scripts/system-packages.txt).
# As root: installs the missing ones with apt-get. Otherwise: prints the exact command to run and
# exits 0, so the tests still run and the ones needing a missing package fail saying so.
# `--print` only prints the missing packages, one line, and installs nothing.
set -euo pipefail
list="$(dirname "$0")/system-packages.txt"
wanted=()
while read -r line; do
  pkg="${line%%#*}"
  pkg="${pkg//[[:space:]]/}"
  [ -n "$pkg" ] && wanted+=("$pkg")
done <"$list"

missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done

if [ "${1:-}" = "--print" ]; then
  echo "${missing[*]}"
  exit 0
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  echo "installing the test system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "missing system packages for the tests; install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  echo "(tests that need them will fail with this command)" >&2
fi
