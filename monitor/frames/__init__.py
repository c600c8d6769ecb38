"""Pure math over the store's frames, below both assess/ and diagnosis/ (docs/DESIGN.md,
layout): the definitions' formulas (data wait, compute, share, throughput, epoch stalls)
over step and host frames. It reads no store and decides nothing."""
