// runtime/cpu/embedding.cpp: token embedding lookup and its backward.
//
//   out[i] = table[tokens[i]]            table [V, d], tokens i32 [..], out [.., d]
//   dtable[tokens[i]] += dout[i]         (serial: repeated tokens accumulate)
// The forward is a row copy (any dtype).  Token ids are range-checked (data).
#include <algorithm>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {

void CpuBackend::run_op(const EmbeddingForwardArgs& call) {
  const int64_t vocab = call.table.shape[0], d = call.table.shape[1], rows = call.tokens.numel();
  check_index_range("embedding_forward", "call.tokens", call.tokens, 0, vocab);
  const int64_t row_bytes = d * scalar_bytes(call.table.dtype);
  const char* src = static_cast<const char*>(call.table.data);
  char* dst = static_cast<char*>(call.out.data);
  const int32_t* ids = call.tokens.ptr<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    std::copy(src + ids[i] * row_bytes, src + (ids[i] + 1) * row_bytes, dst + i * row_bytes);
  }
}

void CpuBackend::run_op(const EmbeddingBackwardArgs& call) {
  const int64_t vocab = call.dtable.shape[0], d = call.dtable.shape[1], rows = call.tokens.numel();
  check_index_range("embedding_backward", "call.tokens", call.tokens, 0, vocab);
  const int32_t* ids = call.tokens.ptr<int32_t>();
  dispatch_compute(call.dtable.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g_in(call.dout);
    if (call.dtable.dtype == scalar_type_of<C>()) {
      C* table = call.dtable.ptr<C>();
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < d; ++c)
          table[ids[i] * d + c] += g_in[i * d + c];
      }
    } else {  // bf16 table gradient: accumulate in fp32 per touched row
      std::vector<C> row(static_cast<size_t>(d));
      for (int64_t i = 0; i < rows; ++i) {
        const TensorView target = slice(call.dtable, ids[i], 1);
        std::copy(g_in.data() + i * d, g_in.data() + (i + 1) * d, row.begin());
        store_converted(row.data(), target, true);
      }
    }
  });
}

}  // namespace modar::runtime::cpu
