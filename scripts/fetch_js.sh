#!/usr/bin/env bash
# Fetches MathJax 3 from the npm registry into .cache/js/, from where the book
# runner (depthkit book) copies it into the built book, so that pages with math
# load no script from a CDN. npm checks the tarball against the registry's
# integrity hash. Safe to re-run: does nothing when the copy is already there.
# (The chart libraries need no step here: they come from vl-convert-python.)
set -euo pipefail
cd "$(dirname "$0")/.."
MATHJAX_VERSION=3.2.2
dest=".cache/js/mathjax-${MATHJAX_VERSION}"
if [ -f "$dest/tex-mml-chtml.js" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is needed to fetch MathJax for the offline book (apt-get install npm)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mathjax@${MATHJAX_VERSION}" >/dev/null)
tar -xzf "$tmp/mathjax-${MATHJAX_VERSION}.tgz" -C "$tmp"
mkdir -p .cache/js
rm -rf "$dest.partial"
# Only the browser build (es5/) is needed: the startup script plus the fonts and
# extensions it loads on demand, relative to its own location.
cp -r "$tmp/package/es5" "$dest.partial"
cp "$tmp/package/LICENSE" "$dest.partial/LICENSE"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "MathJax ${MATHJAX_VERSION} -> $dest"
