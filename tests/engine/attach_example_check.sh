#!/usr/bin/env bash
# The attach-mode example: the trainer written the usual way (char-mlp) learns, and the same
# trainer swapped to zero (char-mlp-zero) learns at N=3 with bitwise identical parameters at
# stages 0, 1 and 2.
#   attach_example_check.sh <char-mlp> <char-mlp-zero>
set -euo pipefail
plain="$1"
swapped="$2"
loss_ok() {  # final smoothed loss well below the uniform entropy
  awk '/^final/ { if ($4 < 0.8 * $6) ok = 1 } END { exit ok ? 0 : 1 }'
}
"$plain" --steps 300 | tee /dev/stderr | loss_ok || { echo "char-mlp did not learn"; exit 1; }
sums=()
for s in 0 1 2; do
  out=$("$swapped" --steps 300 --ranks 3 --zero-stage "$s")
  echo "stage $s: $(echo "$out" | tail -1)"
  echo "$out" | loss_ok || { echo "char-mlp-zero stage $s did not learn"; exit 1; }
  sums+=("$(echo "$out" | awk '/^final/ { print $NF }')")
done
[[ "${sums[0]}" == "${sums[1]}" && "${sums[0]}" == "${sums[2]}" ]] ||
  { echo "checksums differ across stages: ${sums[*]}"; exit 1; }
echo "stages 0, 1, 2 bitwise identical: ${sums[0]}"
