#!/usr/bin/env bash
# Reproduce the Mixture-of-Depths paper's isoFLOP findings (Raposo et al. 2024,
# section 4.1, figures 3 and 4) with modar's default model: Epoch AI fit, MoD
# prior eps derived from the paper's figure 4, MoD capacity 12.5 % every 2,
# sequence length 2048, vocabulary 50304, one H200 (datasheet profile).
#
# Paper:  (1) the isoFLOP-optimal MoD has more parameters than the optimal
#             baseline (~1.5-2x) at about the same forward FLOPs per token;
#         (2) smaller MoD models match the optimal baseline's loss and step
#             faster (up to 66 % faster steps, figure 3 model #3);
#         (3) the optimal baseline at 6e18 FLOPs has ~220M parameters.
#
# Usage: examples/mod_paper_findings.sh [path/to/modar]
set -euo pipefail
cd "$(dirname "$0")/.."
MODAR="${1:-${MODAR:-build/bin/modar}}"
if [ ! -x "$MODAR" ]; then
  echo "modar binary not found at $MODAR (build first: scripts/build.sh)" >&2
  exit 2
fi

for budget in 6e18 2e19 1e20; do
  echo "=== ${budget} training FLOPs: baseline vs MoD (12.5%, every 2) ==="
  "$MODAR" optimal --flops "$budget" --arch baseline,mod |
    grep -E '^(architecture|role|layers x d_model|params total|params FLOP-active|tokens D|fwd FLOPs / token|predicted loss|step time|x params|x fwd FLOPs|x step time|x wall-clock)'
  echo
done

cat <<'TEXT'
Read the columns as: optimal baseline | optimal MoD | parity-fastest MoD.
  (1) "x params" of the optimal MoD > 1 and "x fwd FLOPs / token" ~ 0.8-1.05
      (paper: more parameters, ~1.5-2x, at the same FLOPs per forward pass);
  (2) the parity-fastest MoD's predicted loss <= the optimal baseline's and its
      "x step time" < 1 (paper: up to 66% faster steps, i.e. x ~0.6; modar's
      roofline step times come from FLOPs and bytes of the H200 datasheet
      profile, not from the paper's TPUs);
  (3) the optimal baseline at 6e18 has ~2.2e8 parameters (paper: 220M).
TEXT
