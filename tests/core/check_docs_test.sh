#!/usr/bin/env bash
# tools/check_docs catches what it is for: on a scratch tree, a map with good links passes; a
# link to a missing guide, an anchor with no heading and a README past 300 lines each fail,
# named. Argument: the project root.
set -euo pipefail
check="$1/tools/check_docs"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/docs"
printf '# Guide\n\n## Two words\n\nBack to the [map](../README.md).\n' > "$tree/docs/guide.md"
printf '# zero\n\n[guide](docs/guide.md), [a part](docs/guide.md#two-words)\n' > "$tree/README.md"
"$check" "$tree" >/dev/null || { echo "FAIL: a sound tree was refused"; exit 1; }
printf '[gone](docs/gone.md)\n' >> "$tree/README.md"
if out="$("$check" "$tree")"; then echo "FAIL: a link to a missing guide passed"; exit 1; fi
grep -q "README.md: link to docs/gone.md: no such file" <<<"$out" ||
  { echo "FAIL: unexpected report: $out"; exit 1; }
printf '# zero\n\n[a part](docs/guide.md#three-words)\n' > "$tree/README.md"
if out="$("$check" "$tree")"; then echo "FAIL: an anchor with no heading passed"; exit 1; fi
grep -q "no heading with that anchor" <<<"$out" || { echo "FAIL: unexpected report: $out"; exit 1; }
printf '# zero\n' > "$tree/README.md"
for _ in $(seq 300); do printf 'line\n' >> "$tree/README.md"; done
if out="$("$check" "$tree")"; then echo "FAIL: a 301-line README passed"; exit 1; fi
grep -q "README.md: 301 lines" <<<"$out" || { echo "FAIL: unexpected report: $out"; exit 1; }
echo "check_docs: a missing guide, a missing anchor and a long README caught, a sound map passed"
