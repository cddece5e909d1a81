// CPU registration of the sparsecomm torch ops: the device policy over csrc/cpu's launchers,
// and the op bodies of block.h, select.h and quantize.h instantiated with it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../cpu/launchers.h"
#include "block.h"
#include "quantize.h"
#include "select.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

struct CpuDevice : TensorByTensor<CpuDevice> {
  struct Guard {
    explicit Guard(const at::Device&) {}
  };

  static void check_index_range(const char* op, const at::Tensor& index, int64_t numel) {
    torch_binding::check_index_range(op, index, numel);
  }

  // The launchers, as they are.
#define SC_CPU_TYPED(name)                \
  template <typename T, typename... Args> \
  static void name(Args... args) {        \
    cpu::name<T>(args...);                \
  }
#define SC_CPU_UNTYPED(name)       \
  template <typename... Args>      \
  static void name(Args... args) { \
    cpu::name(args...);            \
  }
  SC_TYPED_LAUNCHERS(SC_CPU_TYPED)
  SC_UNTYPED_LAUNCHERS(SC_CPU_UNTYPED)
#undef SC_CPU_TYPED
#undef SC_CPU_UNTYPED

  // Raw bytes on the host (quantize.h's segments): a few small copies, each a memcpy.
  // (An empty tensor's data pointer may be null, which memcpy and memset must not be given.)
  static void copy_bytes(const at::Tensor& from, const at::Tensor& to) {
    if (from.nbytes() > 0) std::memcpy(to.data_ptr(), from.data_ptr(), size_t(from.nbytes()));
  }
  static void zero_bytes(const at::Tensor& t) {
    if (t.nbytes() > 0) std::memset(t.data_ptr(), 0, size_t(t.nbytes()));
  }
  static void write_count(const at::Tensor& segment, int64_t count) {
    std::memcpy(segment.data_ptr(), &count, sizeof(count));
  }
  static int64_t read_count(const at::Tensor& gathered, int64_t at) {
    int64_t count;
    std::memcpy(&count, gathered.data_ptr<uint8_t>() + at, sizeof(count));
    return count;
  }

  static void segment_offsets(const at::Tensor& index, const at::Tensor& counts, const at::Tensor& offsets) {
    TORCH_CHECK(cpu::segment_offsets(index.data_ptr<int32_t>(), index.numel(), counts.numel() / kWireOffsetBytes,
                                     counts.data_ptr<uint8_t>(), offsets.data_ptr<uint8_t>()),
                "quantized_segment: index should be strictly ascending and below numel");
  }
  static void segment_index(const at::Tensor& counts, const at::Tensor& offsets, const at::Tensor& index) {
    TORCH_CHECK(cpu::segment_index(counts.data_ptr<uint8_t>(), counts.numel() / kWireOffsetBytes,
                                   offsets.data_ptr<uint8_t>(), index.numel(), index.data_ptr<int32_t>()),
                "sparse_unpack_segments: a segment's bucket counts do not add up to its count, ", index.numel());
  }

  // Each fixed segment's items in turn, its count and indices checked first: they are in host memory.
  static void write_fixed_segments(const std::vector<FixedSegmentSend>& sends, int64_t, const at::Device&) {
    const int64_t p = cpu::fixed_segments(sends.data(), int64_t(sends.size()));
    if (p < 0) return;
    const int64_t count = *sends[p].count, room = sends[p].room;
    TORCH_CHECK(count >= 0 && count <= room, "quantized_segments_fixed_into: send ", p, "'s count should lie in [0, ",
                room, "], its room, got ", count);
    TORCH_CHECK(false, "quantized_segments_fixed_into: send ", p,
                "'s index should be strictly ascending and below its numel up to its count, ", count);
  }
  // Tensor by tensor, each rank's fixed segment decoded in place (its count in host memory already)
  // into this thread's reused columns, then one unpack, as sparse_unpack_segments_into does.
  static void unpack_gathered_segments(const at::Tensor& gathered, const std::vector<SegmentRegion>& regions, int bits,
                                       UnpackScale scale, at::TensorList outs) {
    static thread_local std::vector<float> values;
    static thread_local std::vector<int32_t> index;
    const int64_t ranks = gathered.size(0), chunk = gathered.size(1);
    for (size_t p = 0; p < outs.size(); ++p) {
      const QuantizedSegment layout(regions[p].room, bits, regions[p].buckets);
      values.resize(size_t(std::max<int64_t>(ranks * layout.room, 1)));  // (at least one: never a null pointer)
      index.resize(values.size());
      int64_t n = 0;
      for (int64_t r = 0; r < ranks; ++r) {
        const uint8_t* segment = gathered.data_ptr<uint8_t>() + r * chunk + regions[p].offset;
        int64_t count;
        std::memcpy(&count, segment, sizeof(count));
        TORCH_CHECK(count >= 0 && count <= layout.room, "sparse_unpack_gathered_segments: rank ", r, " has a count of ",
                    count, " for out ", p, ", whose segment has room for ", layout.room);
        dequantize(segment + layout.codes_at, reinterpret_cast<const float*>(segment + layout.scales_at), count, bits,
                   values.data() + n);
        TORCH_CHECK(cpu::segment_index(segment + layout.counts_at, layout.buckets, segment + layout.offsets_at, count,
                                       index.data() + n),
                    "sparse_unpack_gathered_segments: rank ", r, "'s bucket counts for out ", p,
                    " do not add up to its count, ", count);
        n += count;
      }
      const at::Tensor v = at::from_blob(values.data(), {n}, at::kFloat);
      unpack_into<CpuDevice>(v.to(outs[p].scalar_type()), at::from_blob(index.data(), {n}, at::kInt), scale, outs[p]);
    }
    cpu::kept_capacity(values);
    cpu::kept_capacity(index);
  }

  static void wire_rows(const at::Tensor& values, const at::Tensor& index, int64_t start, int64_t length,
                        const at::Tensor& rows) {
    write_rows(values, index, index.numel(), start, length, rows.data_ptr<uint8_t>());
  }
  // Each send's rows straight into their place in the chunk; a fixed capacity's count is in host
  // memory already.
  static void wire_rows_many(const std::vector<WireSend>& sends, const at::Device&) {
    for (const WireSend& s : sends) {
      const int64_t count = s.count ? *s.count : s.index.numel();
      TORCH_CHECK(count >= 0 && count <= s.values.numel(), "wire_rows_fixed_into: a count of ", count,
                  " should lie in [0, ", s.values.numel(), "], its send's room");
      write_rows(s.values, s.index, count, 0, s.length, s.rows);
      const int64_t rows = count + wire_buckets(0, s.length);
      if (s.rows_count) std::memcpy(s.rows_count, &rows, sizeof(rows));  // (the chunk's bytes: maybe unaligned)
    }
  }
  static void write_rows(const at::Tensor& values, const at::Tensor& index, int64_t count, int64_t start,
                         int64_t length, uint8_t* rows) {
    TORCH_CHECK(
        cpu::wire_rows(values.data_ptr(), values.element_size(), index.data_ptr<int32_t>(), count, start, length, rows),
        "wire_rows: index should be strictly ascending and inside [start, start + length) = [", start, ", ",
        start + length, ")");
  }
  // The marker rows are dropped in the pass (exact or not).
  static std::tuple<at::Tensor, at::Tensor> wire_columns(const at::Tensor& rows, at::ScalarType value_dtype, bool) {
    at::Tensor values = at::empty({rows.size(0)}, rows.options().dtype(value_dtype));
    at::Tensor index = at::empty({rows.size(0)}, rows.options().dtype(at::kInt));
    const int64_t n = decode_rows(rows.data_ptr<uint8_t>(), rows.size(0), values.element_size(), values.data_ptr(),
                                  index.data_ptr<int32_t>());
    return {values.narrow(0, 0, n), index.narrow(0, 0, n)};
  }
  // `count` rows' values and indices into the columns: how many elements they held.
  static int64_t decode_rows(const uint8_t* rows, int64_t count, int64_t value_bytes, void* values, int32_t* index) {
    const int64_t n = cpu::wire_columns(rows, count, value_bytes, values, index);
    TORCH_CHECK(n >= 0, "wire rows: an element comes before its bucket's marker row, or past 2^31 - 1");
    return n;
  }

  // Tensor by tensor, each one's rows of every rank (in rank order) unpacked as
  // sparse_unpack_rows_into does: the counts are in host memory already. Each rank's rows are
  // read in place into this thread's reused columns, with no tensor per rank or per parameter.
  static void unpack_gathered_rows(const at::Tensor& gathered, at::IntArrayRef regions, int64_t width,
                                   at::ScalarType value_dtype, UnpackScale scale, at::TensorList outs) {
    static thread_local std::vector<uint8_t> values;
    static thread_local std::vector<int32_t> index;
    static thread_local std::vector<int64_t> counts;  // each rank's rows of the out at hand
    const int64_t ranks = gathered.size(0), chunk = gathered.size(1), value_bytes = width - kWireOffsetBytes;
    const uint8_t* all = gathered.data_ptr<uint8_t>();
    counts.resize(size_t(ranks));
    for (size_t p = 0; p < outs.size(); ++p) {
      int64_t total = 0;
      for (int64_t r = 0; r < ranks; ++r) {
        counts[r] = gathered_count(all + r * chunk, regions, p, r, width);
        total += counts[r];
      }
      values.resize(size_t(std::max<int64_t>(total, 1) * value_bytes));  // (at least one: never a null pointer)
      index.resize(size_t(std::max<int64_t>(total, 1)));
      int64_t n = 0;
      for (int64_t r = 0; r < ranks; ++r)
        n += decode_rows(all + r * chunk + regions[3 * p + 1], counts[r], value_bytes, values.data() + n * value_bytes,
                         index.data() + n);
      const at::Tensor v = at::from_blob(values.data(), {n}, at::TensorOptions().dtype(value_dtype));
      unpack_into<CpuDevice>(v.to(outs[p].scalar_type()), at::from_blob(index.data(), {n}, at::kInt), scale, outs[p]);
    }
    cpu::kept_capacity(values);
    cpu::kept_capacity(index);
  }
  // Rank r's number of rows of out p (in r's chunk), checked against its region.
  static int64_t gathered_count(const uint8_t* chunk, at::IntArrayRef regions, size_t p, int64_t r, int64_t width) {
    int64_t count;
    std::memcpy(&count, chunk + regions[3 * p] * int64_t(sizeof(int64_t)), sizeof(count));
    TORCH_CHECK(count >= 0 && count * width <= regions[3 * p + 2], "sparse_unpack_gathered_rows: rank ", r, " has ",
                count, " rows of ", width, " bytes for out ", p, ", whose region has ", regions[3 * p + 2], " bytes");
    return count;
  }

  // The threshold is computed on the host: a float, not a device tensor.
  template <typename T>
  static at::Tensor sample_threshold(const FeedbackArgs& a, const SamplePlan& plan) {
    const float t = cpu::sample_threshold<T>(data_as<T>(a.grad), a.fb, a.grad.numel(), plan);
    return at::scalar_tensor(t, a.grad.options().dtype(at::kFloat));
  }

  // One pass that appends the candidates to this thread's reused lists (CUDA counts first instead,
  // and compacts once the totals are read).
  template <typename T>
  static std::tuple<at::Tensor, at::Tensor> accumulate_candidates(const FeedbackArgs& a, const at::Tensor& threshold) {
    static thread_local std::vector<float> acc;
    static thread_local std::vector<int32_t> index;
    acc.clear();
    index.clear();
    cpu::accumulate_candidates<T>(data_as<T>(a.grad), a.fb, a.grad.numel(), threshold.item<float>(), acc, index);
    at::Tensor acc_t = at::empty({int64_t(acc.size())}, at::kFloat);
    at::Tensor index_t = at::empty({int64_t(index.size())}, at::kInt);
    std::copy(acc.begin(), acc.end(), acc_t.data_ptr<float>());
    std::copy(index.begin(), index.end(), index_t.data_ptr<int32_t>());
    cpu::kept_capacity(acc);
    cpu::kept_capacity(index);
    return {acc_t, index_t};
  }

  // An in-place selection on copies of the candidates (CUDA uses torch's sort instead).
  static std::tuple<at::Tensor, at::Tensor> select_top(const at::Tensor& acc_in, const at::Tensor& index_in,
                                                       int64_t k) {
    return select_top_in_place(acc_in.contiguous().clone(), index_in.contiguous().clone(), k);
  }

  // A bucket's tops (select.h's banded), in place: its candidate lists are the pack's own.
  static std::vector<std::tuple<at::Tensor, at::Tensor>> select_top_many(const std::vector<TopOf>& lists) {
    std::vector<std::tuple<at::Tensor, at::Tensor>> tops;
    for (const TopOf& list : lists) tops.push_back(select_top_in_place(list.acc, list.index, list.k));
    return tops;
  }
  // The k largest of contiguous candidates, selected where they lie: views of their front.
  static std::tuple<at::Tensor, at::Tensor> select_top_in_place(const at::Tensor& acc, const at::Tensor& index,
                                                                int64_t k) {
    const int64_t kept = cpu::select_top(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), k);
    return {acc.narrow(0, 0, kept), index.narrow(0, 0, kept)};
  }

  // Sums duplicates in input order directly (CUDA sorts the indices first).
  template <typename T>
  static void sparse_unpack(const at::Tensor& values, const at::Tensor& index, UnpackScale scale,
                            const at::Tensor& out) {
    cpu::sparse_unpack<T>(data_as<T>(values), index.data_ptr<int32_t>(), values.numel(), scale.value(), out.numel(),
                          data_as<T>(out));
  }

  // The launcher writes the indices sorted (CUDA sorts afterwards).
  static at::Tensor random_k_indices(const Permutation& perm, int64_t k, at::Tensor out) {
    cpu::random_k_indices(perm, k, out.data_ptr<int32_t>());
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  register_block_ops<CpuDevice>(m);
  register_select_ops<CpuDevice>(m);
  register_quantize_ops<CpuDevice>(m);
}

}  // namespace torch_binding
}  // namespace sparsecomm
