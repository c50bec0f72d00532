#!/usr/bin/env bash
# Refreshes third_party/uplot/ (the charting library `atoll report` inlines into its pages) from
# npm: the minified browser build, its stylesheet and its MIT licence, at the pinned version.
# Usage: scripts/update_uplot.sh [VERSION]   (then update the version in third_party/uplot/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-1.6.32}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$version" >/dev/null && tar xzf "uplot-$version.tgz")
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$tmp/package/LICENSE" third_party/uplot/
sha256sum "$tmp/uplot-$version.tgz"
echo "third_party/uplot: uPlot $version"
