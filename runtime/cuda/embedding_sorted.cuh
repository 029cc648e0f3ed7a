// runtime/cuda/embedding_sorted.cuh: the deterministic embedding backward.
// Kernels: embedding_sorted.cu.
#pragma once

#include "launch.hpp"

namespace modar::gpu {

class CachingAllocator;

// dtable[tokens[i]] += dout[i] with NO atomics: the rows are stably sorted by
// token (cub radix sort of (token, row) pairs), then each run of equal tokens
// is summed in fp32 in row order and added to the table row, rounded once.
// So repeated steps give bitwise-identical gradients, and a bf16 table is
// rounded once per element per op (as on the CPU backend).  Tokens outside
// [0, vocab) are skipped.  Temporaries (sorted keys and rows, cub's storage)
// come from `allocator` (stream-ordered, cached).
void launch_embedding_backward_sorted(const void* dout, Elem dout_type, const int32_t* tokens,
                                      void* dtable, Elem dtable_type, int64_t rows, int64_t d,
                                      int64_t vocab, CachingAllocator& allocator,
                                      cudaStream_t stream);

}  // namespace modar::gpu
