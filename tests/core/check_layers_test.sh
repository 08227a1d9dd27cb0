#!/usr/bin/env bash
# tools/check_layers catches what it is for: on a scratch tree, an include that points down
# passes, one that points up (core -> engine) fails naming the file, and a file in no layer
# fails. Argument: the project root.
set -euo pipefail
check="$1/tools/check_layers"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/zero/core" "$tree/include/zero"
printf '#pragma once\n' > "$tree/include/zero/error.hpp"
printf '#pragma once\n#include "zero/error.hpp"\n' > "$tree/zero/placement.hpp"
printf '#include "zero/error.hpp"\n' > "$tree/zero/core/log.cpp"
"$check" "$tree" >/dev/null || { echo "FAIL: a downward include was refused"; exit 1; }
printf '#include "zero/placement.hpp"\n' >> "$tree/zero/core/log.cpp"
if out="$("$check" "$tree")"; then echo "FAIL: core -> engine passed"; exit 1; fi
grep -q "zero/core/log.cpp:2: layer 'core' includes zero/placement.hpp" <<<"$out" ||
  { echo "FAIL: unexpected report: $out"; exit 1; }
printf '#include "zero/error.hpp"\n' > "$tree/zero/core/log.cpp"
printf '\n' > "$tree/include/zero/new_header.hpp"
if out="$("$check" "$tree")"; then echo "FAIL: a header in no layer passed"; exit 1; fi
grep -q "include/zero/new_header.hpp: in no layer" <<<"$out" ||
  { echo "FAIL: unexpected report: $out"; exit 1; }
echo "check_layers: up-include and unplaced file caught, down-include passed"
