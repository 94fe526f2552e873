// Diagnostic cuts of the sm90 attention kernel, for benchmarks only: where a prefill's time goes
// is read off the kernel rebuilt with a part removed (`h200_quick.sh prefill-cuts` edits the
// value below on the GPU machine, rebuilds, times the prefill, and restores 0). A cut kernel's
// outputs are wrong; 0 (the only value this repository builds with) compiles every part.
#pragma once

#define DSPINE_SM90_CUTS 0

namespace dspine::gpu {

// Bit 1: the producer loads a stage's K and V only for the first kStages tiles, then hands the
// consumers the stale stage (the table reads and every barrier stay).
constexpr int kSm90CutLoads = 1;
// Bit 2: the consumers skip the online softmax (P is the raw scores, no correction).
constexpr int kSm90CutSoftmax = 2;

constexpr bool sm90_cut(int part) { return (DSPINE_SM90_CUTS & part) != 0; }

// Whether the producer loads the CTA's i-th tile (of K or V) into its stage: always, unless the
// loads are cut and the stage has been filled once already.
constexpr bool sm90_loads_tile(int i, int stages) { return !sm90_cut(kSm90CutLoads) || i < stages; }

}  // namespace dspine::gpu
