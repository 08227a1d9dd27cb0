#!/usr/bin/env bash
# tools/check_layers catches what it is for: on a scratch tree, an include that points down
# passes; one that points up (core -> engine) fails naming the file, from a source file and from
# a public header; a file whose folder is in no layer fails. Argument: the project root.
set -euo pipefail
check="$1/tools/check_layers"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/core" "$tree/engine" "$tree/include/zero/core" "$tree/include/zero/engine"
printf '#pragma once\n' > "$tree/include/zero/core/error.hpp"
printf '#pragma once\n' > "$tree/include/zero/engine/engine.hpp"
printf '#pragma once\n#include "zero/core/error.hpp"\n' > "$tree/engine/placement.hpp"
printf '#include "zero/core/error.hpp"\n' > "$tree/core/log.cpp"
"$check" "$tree" >/dev/null || { echo "FAIL: a downward include was refused"; exit 1; }
printf '#include "engine/placement.hpp"\n' >> "$tree/core/log.cpp"
if out="$("$check" "$tree")"; then echo "FAIL: core -> engine passed"; exit 1; fi
grep -q "core/log.cpp:2: layer 'core' includes engine/placement.hpp of the higher layer 'engine'" \
  <<<"$out" || { echo "FAIL: unexpected report: $out"; exit 1; }
printf '#include "zero/core/error.hpp"\n' > "$tree/core/log.cpp"
printf '#pragma once\n#include "zero/engine/engine.hpp"\n' >> "$tree/include/zero/core/error.hpp"
if out="$("$check" "$tree")"; then echo "FAIL: a core header including an engine header passed"; exit 1; fi
grep -q "include/zero/core/error.hpp:3: layer 'core' includes include/zero/engine/engine.hpp" \
  <<<"$out" || { echo "FAIL: unexpected report: $out"; exit 1; }
printf '#pragma once\n' > "$tree/include/zero/core/error.hpp"
"$check" "$tree" >/dev/null || { echo "FAIL: the repaired tree was refused"; exit 1; }
printf '\n' > "$tree/include/zero/new_header.hpp"
if out="$("$check" "$tree")"; then echo "FAIL: a header in no layer's folder passed"; exit 1; fi
grep -q "include/zero/new_header.hpp: in no layer" <<<"$out" ||
  { echo "FAIL: unexpected report: $out"; exit 1; }
echo "check_layers: up-includes (source, public header) and an unplaced file caught, down-include passed"
