// runtime/cpu/embedding.cpp: token embedding lookup and its backward.
//
//   out[i] = table[tokens[i]]            table [V, d], tokens i32 [..], out [.., d]
//   dtable[tokens[i]] += dout[i]         (serial: repeated tokens accumulate)
// The forward is a row copy (any dtype).  Token ids are range-checked (data).
#include <algorithm>

#include "cpu_backend.hpp"
#include "cpu_common.hpp"

namespace modar::runtime::cpu {

void CpuBackend::embedding_forward_impl(const TensorView& table, const TensorView& tokens,
                                        const TensorView& out) {
  const int64_t vocab = table.shape[0], d = table.shape[1], rows = tokens.numel();
  check_index_range("embedding_forward", "tokens", tokens, 0, vocab);
  const int64_t row_bytes = d * scalar_bytes(table.dtype);
  const char* src = static_cast<const char*>(table.data);
  char* dst = static_cast<char*>(out.data);
  const int32_t* ids = tokens.ptr<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    std::copy(src + ids[i] * row_bytes, src + (ids[i] + 1) * row_bytes, dst + i * row_bytes);
  }
}

void CpuBackend::embedding_backward_impl(const TensorView& dout, const TensorView& tokens,
                                         const TensorView& dtable) {
  const int64_t vocab = dtable.shape[0], d = dtable.shape[1], rows = tokens.numel();
  check_index_range("embedding_backward", "tokens", tokens, 0, vocab);
  const int32_t* ids = tokens.ptr<int32_t>();
  dispatch_compute(dtable.dtype, [&](auto tag) {
    using C = decltype(tag);
    Input<C> g_in(dout);
    if (dtable.dtype == scalar_type_of<C>()) {
      C* table = dtable.ptr<C>();
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < d; ++c)
          table[ids[i] * d + c] += g_in[i * d + c];
      }
    } else {  // bf16 table gradient: accumulate in fp32 per touched row
      std::vector<C> row(static_cast<size_t>(d));
      for (int64_t i = 0; i < rows; ++i) {
        const TensorView target = slice(dtable, ids[i], 1);
        std::copy(g_in.data() + i * d, g_in.data() + (i + 1) * d, row.begin());
        store_converted(row.data(), target, true);
      }
    }
  });
}

}  // namespace modar::runtime::cpu
