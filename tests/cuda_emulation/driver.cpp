// Executes every CUDA launcher of csrc/cuda/launchers.h on the CPU emulation
// (csrc/emulation/cuda_emulation.h) and its CPU twin of csrc/cpu/launchers.h on the same
// inputs, and compares every output and state buffer bit for bit. Built by
// tests/cuda_emulation/build_driver.py under ThreadSanitizer or AddressSanitizer + UBSan, run by
// tests/test_cuda_emulation.py.
//
//   driver [GROUP...]   runs the named groups (default: all); exits 1 at the first mismatch
//   driver --list       the groups
//   driver canary-race | canary-ballot | canary-barrier | canary-oob
//                       deliberately broken kernels: the sanitizer or the emulation must stop them
//
// Where a CUDA launcher's contract differs from the CPU one, the host glue is done here the way
// csrc/torch/cuda.cpp does it, and the final results are compared.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include <sanitizer/common_interface_defs.h>

#include <cuda_runtime_api.h>  // the emulation's: build_driver.py puts csrc/emulation/include on the path
#include "../../csrc/cpu/launchers.h"
#include "../../csrc/cuda/grid.cuh"
#include "../../csrc/cuda/launchers.h"

namespace sc = sparsecomm;
using sc::bfloat16;
using sc::Feedback;
using sc::half16;

namespace {

// ---- what is running, for every failure message ----

char g_case[512] = "(no case yet)";
long g_cases = 0, g_nan_payloads = 0;

void set_case(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(g_case, sizeof g_case, format, args);
  va_end(args);
  ++g_cases;
}

void print_case() {  // also from the sanitizers' death callback and SIGABRT: write(2) only
  const char prefix[] = "while running case: ";
  (void)!write(2, prefix, sizeof prefix - 1);
  (void)!write(2, g_case, std::strlen(g_case));
  (void)!write(2, "\n", 1);
}

[[noreturn]] void fail(const char* format, ...) {
  std::fprintf(stdout, "MISMATCH in %s: ", g_case);
  va_list args;
  va_start(args, format);
  std::vfprintf(stdout, format, args);
  va_end(args);
  std::fprintf(stdout, "\n");
  std::fflush(stdout);
  std::exit(1);
}

// ---- inputs ----

struct Rng {  // splitmix64: every case's inputs follow from its seed
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return n > 0 ? int64_t(next() % uint64_t(n)) : 0; }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
};

// Float patterns at every edge the kernels and the 16-bit conversions care about.
constexpr uint32_t kSpecials[] = {
    0x00000000, 0x80000000,                          // +0, -0
    0x7f800000, 0xff800000,                          // +-inf
    0x7fc00000, 0xffc00000, 0x7fa00001,              // quiet NaNs, a signalling NaN
    0x00000001, 0x807fffff, 0x00400000,              // float denormals
    0x00800000, 0x7f7fffff, 0xff7fffff,              // FLT_MIN, +-FLT_MAX
    0x33800000, 0x33000000, 0x33c00000, 0xb3400000,  // half's subnormal ulp and ties below it
    0x387fe000, 0x38800000,                          // around the smallest normal half
    0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000,  // 65504, just below and at half's overflow
    0x3f808000, 0x3f818000, 0x3f801000, 0x3f803000,  // bfloat16 and half ties (to even, to odd)
    0x3f800000, 0xbf800000, 0x3e800000,              // 1, -1, 0.25
};

float special(Rng& r) { return sc::bits_float(kSpecials[r.below(std::size(kSpecials))]); }

// Mostly ordinary magnitudes over 25 octaves, a quarter edge cases.
float value(Rng& r) {
  if (r.below(4) == 0) return special(r);
  const float v = float(std::ldexp(1.0 + r.uniform(), int(r.below(25)) - 12));
  return r.below(2) ? -v : v;
}

// A gradient element: also raw bit patterns (every NaN payload, every 16-bit pattern).
template <typename T>
T element(Rng& r) {
  if constexpr (std::is_same_v<T, float>) return r.below(20) == 0 ? sc::bits_float(uint32_t(r.next())) : value(r);
  else return r.below(3) == 0 ? T{uint16_t(r.next())} : sc::from_float<T>(value(r));
}

template <typename T>
std::vector<T> random_vector(int64_t n, Rng& r) {
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = element<T>(r);
  return v;
}

std::vector<float> random_floats(int64_t n, Rng& r) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = value(r);
  return v;
}

// count distinct indices of [0, numel), ascending (candidates come in index order).
std::vector<int32_t> distinct_sorted(int64_t count, int64_t numel, Rng& r) {
  std::vector<int32_t> all(static_cast<size_t>(numel));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t j = 0; j < count; ++j) std::swap(all[size_t(j)], all[size_t(j + r.below(numel - j))]);
  all.resize(size_t(count));
  std::sort(all.begin(), all.end());
  return all;
}

template <typename T> const char* type_name();
template <> const char* type_name<float>() { return "float32"; }
template <> const char* type_name<half16>() { return "float16"; }
template <> const char* type_name<bfloat16>() { return "bfloat16"; }

template <typename F>
void for_each_dtype(F f) {
  f(float{});
  f(half16{});
  f(bfloat16{});
}

// ---- bit-for-bit comparison ----

template <typename T>
std::string show(const T& x) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof x);
  double v;
  if constexpr (std::is_same_v<T, half16> || std::is_same_v<T, bfloat16>) v = sc::to_float(x);
  else v = double(x);
  char text[96];
  std::snprintf(text, sizeof text, "0x%0*llx (%.9g)", int(2 * sizeof x), (unsigned long long)bits, v);
  return text;
}

template <typename T>
bool is_nan(const T& x) {
  if constexpr (std::is_same_v<T, half16> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>)
    return std::isnan(sc::to_float(x));
  else return false;
}

// Identical bits, except that any NaN equals any NaN: NaN payloads are not portable. x86
// returns the payload of one NaN operand and the compiler picks the operand order (CPU and
// emulated code inline feedback.h differently); a GPU returns its canonical NaN instead.
template <typename T>
bool identical(const T& a, const T& b) {
  if (std::memcmp(&a, &b, sizeof(T)) == 0) return true;
  const bool nans = is_nan(a) && is_nan(b);
  g_nan_payloads += nans;  // reported with the group's result
  return nans;
}

template <typename T>
void same(const char* buffer, const std::vector<T>& cuda, const std::vector<T>& cpu, const char* a = "cuda",
          const char* b = "cpu") {
  if (cuda.size() != cpu.size()) fail("%s: %s has %zu elements, %s %zu", buffer, a, cuda.size(), b, cpu.size());
  size_t first = cuda.size(), differ = 0;
  for (size_t i = 0; i < cuda.size(); ++i)
    if (!identical(cuda[i], cpu[i]) && differ++ == 0) first = i;
  if (differ)
    fail("%s[%zu]: %s %s, %s %s (%zu of %zu elements differ)", buffer, first, a, show(cuda[first]).c_str(), b,
         show(cpu[first]).c_str(), differ, cuda.size());
}

void same_value(const char* what, float cuda, float cpu) { same(what, std::vector<float>{cuda}, std::vector<float>{cpu}); }

constexpr int64_t kSizes[] = {0, 1, 31, 32, 33, 255, 256, 257, 4095, 4096, 4097, 10007, 12289};

// The state of a case: absent, updated in place (torch), or read from one buffer and written to
// another (TF).
enum class State { none, in_place, in_out };
const char* state_name(State s) { return s == State::none ? "none" : s == State::in_place ? "in-place" : "in->out"; }

// A float state buffer on both sides: in (read) and out (written), as the mode wants. A
// separate output starts with different garbage on each side, so an element left unwritten
// shows.
struct StateBuffers {
  std::vector<float> in, cuda_out, cpu_out;
  StateBuffers(State mode, int64_t n, Rng& r) : mode_(mode) {
    if (mode == State::none) return;
    in = random_floats(n, r);
    cuda_out = mode == State::in_place ? in : random_floats(n, r);
    cpu_out = mode == State::in_place ? in : random_floats(n, r);
  }
  const float* cuda_in() const { return mode_ == State::none ? nullptr : mode_ == State::in_place ? cuda_out.data() : in.data(); }
  const float* cpu_in() const { return mode_ == State::none ? nullptr : mode_ == State::in_place ? cpu_out.data() : in.data(); }
  float* cuda() { return mode_ == State::none ? nullptr : cuda_out.data(); }
  float* cpu() { return mode_ == State::none ? nullptr : cpu_out.data(); }
  State mode_;
};

// The cyclic blocks the block launchers are checked on, over n elements: the whole tensor, one
// that wraps from the last element, and a random one (start, length).
struct Blocks {
  int64_t starts[3], lengths[3];
};
Blocks blocks_of(int64_t n, Rng& r) {
  // (a braced list is evaluated in order: r draws the random start, then the random length)
  return {{0, n ? n - 1 : 0, r.below(n)}, {n, std::min<int64_t>(n, 2 + n / 3), r.below(n + 1)}};
}

// ---- the launchers ----

void check_block_pack() {
  for_each_dtype([]<typename T>(T) {
    for (int64_t n : kSizes) {
      Rng r{uint64_t(n) * 31 + sizeof(T)};
      const auto [starts, lengths] = blocks_of(n, r);
      for (int s = 0; s < 3; ++s)
        for (State mode : {State::none, State::in_place, State::in_out}) {
          set_case("block_pack<%s> numel=%lld start=%lld length=%lld residual=%s", type_name<T>(), (long long)n,
                   (long long)starts[s], (long long)lengths[s], state_name(mode));
          const std::vector<T> grad = random_vector<T>(n, r);
          StateBuffers residual(mode, n, r);
          std::vector<T> cuda_values = random_vector<T>(lengths[s], r), cpu_values = random_vector<T>(lengths[s], r);
          sc::cuda::block_pack<T>(grad.data(), residual.cuda_in(), residual.cuda(), cuda_values.data(), n, starts[s],
                                  lengths[s], nullptr);
          sc::cpu::block_pack<T>(grad.data(), residual.cpu_in(), residual.cpu(), cpu_values.data(), n, starts[s],
                                 lengths[s]);
          same("values", cuda_values, cpu_values);
          same("residual", residual.cuda_out, residual.cpu_out);
        }
    }
  });
}

void check_block_unpack() {
  for_each_dtype([]<typename T>(T) {
    for (int64_t n : kSizes) {
      Rng r{uint64_t(n) * 37 + sizeof(T)};
      const auto [starts, lengths] = blocks_of(n, r);
      const float scales[] = {1.0f, 0.5f, -1.0f / 3.0f};
      for (int s = 0; s < 3; ++s) {
        set_case("block_unpack<%s> numel=%lld start=%lld length=%lld scale=%g", type_name<T>(), (long long)n,
                 (long long)starts[s], (long long)lengths[s], scales[s]);
        const std::vector<T> values = random_vector<T>(lengths[s], r);
        std::vector<T> cuda_dense = random_vector<T>(n, r), cpu_dense = random_vector<T>(n, r);
        sc::cuda::block_unpack<T>(values.data(), cuda_dense.data(), n, starts[s], lengths[s], scales[s], nullptr);
        sc::cpu::block_unpack<T>(values.data(), cpu_dense.data(), n, starts[s], lengths[s], scales[s]);
        same("dense", cuda_dense, cpu_dense);
      }
    }
  });
}

// Residual and momentum of the selection ops (DGC: both; gradient dropping: residual only).
// scaled: the gradient read times a grad_scale (DGC's clipping factor; it needs a state).
struct FeedbackCase {
  const char* name;
  State residual, momentum;
  bool scaled = false;
};
constexpr FeedbackCase kFeedback[] = {
    {"none", State::none, State::none},
    {"residual in-place", State::in_place, State::none},
    {"residual in->out", State::in_out, State::none},
    {"momentum in-place", State::none, State::in_place},
    {"residual+momentum in-place", State::in_place, State::in_place},
    {"momentum in-place, gradient scaled", State::none, State::in_place, true},
    {"residual+momentum in-place, gradient scaled", State::in_place, State::in_place, true},
};

struct FeedbackBuffers {
  StateBuffers residual, momentum;
  bool scaled;
  float scale = 0.37f;  // (rounds: not a power of two)
  FeedbackBuffers(const FeedbackCase& c, int64_t n, Rng& r)
      : residual(c.residual, n, r), momentum(c.momentum, n, r), scaled(c.scaled) {}
  Feedback cuda() {
    Feedback fb;
    fb.grad_scale = scaled ? &scale : nullptr;
    fb.residual_in = residual.cuda_in();
    fb.residual_out = residual.cuda();
    fb.momentum_in = momentum.cuda_in();
    fb.momentum_out = momentum.cuda();
    fb.momentum = 0.9f;
    return fb;
  }
  Feedback cpu() {
    Feedback fb = cuda();
    fb.residual_in = residual.cpu_in();
    fb.residual_out = residual.cpu();
    fb.momentum_in = momentum.cpu_in();
    fb.momentum_out = momentum.cpu();
    return fb;
  }
  void compare() {
    same("residual", residual.cuda_out, residual.cpu_out);
    same("momentum", momentum.cuda_out, momentum.cpu_out);
  }
  void unchanged_since(const FeedbackBuffers& before) {  // for the read-only ops
    same("residual", residual.cuda_out, before.residual.cuda_out, "cuda", "before");
    same("residual", residual.cpu_out, before.residual.cpu_out, "cpu", "before");
    same("momentum", momentum.cuda_out, before.momentum.cuda_out, "cuda", "before");
    same("momentum", momentum.cpu_out, before.momentum.cpu_out, "cpu", "before");
  }
};

void check_sample_threshold() {
  for_each_dtype([]<typename T>(T) {
    for (int64_t n : kSizes) {
      Rng r{uint64_t(n) * 41 + sizeof(T)};
      // (wanted sample size, ratio): every element; runs of 16 (n / wanted >= 32); a single one.
      const int64_t wanted[] = {n, std::max<int64_t>(1, n / 40), 1};
      const double ratios[] = {0.3, 0.001, 1.0};
      {  // one case per (dtype, size): the plan and the feedback rotate (ThreadSanitizer's time)
        const int p = int(size_t(n + sizeof(T)) % 3);
        const FeedbackCase& fc = kFeedback[size_t(n / 3 + sizeof(T)) % std::size(kFeedback)];
        const sc::SamplePlan plan = sc::plan_sample(n, wanted[p], ratios[p], r.next(), uint32_t(r.next()), r.next());
        set_case("sample_threshold<%s> numel=%lld plan(count=%lld run=%lld stride=%lld offset=%lld rank=%lld) "
                 "feedback=%s", type_name<T>(), (long long)n, (long long)plan.count, (long long)plan.run,
                 (long long)plan.stride, (long long)plan.offset, (long long)plan.rank, fc.name);
        const std::vector<T> grad = random_vector<T>(n, r);
        FeedbackBuffers state(fc, n, r);
        const FeedbackBuffers before = state;
        const Feedback fb = state.cuda();
        std::vector<float> sample(static_cast<size_t>(sc::cuda::sample_scratch_floats(plan.count)), -1.0f);
        std::vector<float> threshold(1, -1.0f);
        sc::cuda::sample_threshold<T>(grad.data(), fb, n, plan, sample.data(), threshold.data(), nullptr);
        sample.resize(static_cast<size_t>(plan.count));  // the select's state follows the sample
        // The gathered sample, element by element, then the selected threshold.
        std::vector<float> expected(static_cast<size_t>(plan.count));
        float u;
        for (int64_t j = 0; j < plan.count; ++j)
          expected[size_t(j)] = sc::magnitude(sc::accumulated(grad.data(), fb, plan.position(j), &u));
        same("sample", sample, expected);
        // A zero threshold may be either zero on the CPU: magnitude(-0.0f) is -0.0f (feedback.h)
        // and nth_element leaves whichever zero at the rank. Both select the same elements.
        const float cpu = sc::cpu::sample_threshold<T>(grad.data(), state.cpu(), n, plan);
        same_value("threshold", threshold[0], cpu == 0.0f ? 0.0f : cpu);
        state.unchanged_since(before);
      }
    }
  });
}

// accumulate_count + exclusive scan + compact_candidates (csrc/torch/cuda.cpp's glue) against
// the one-pass CPU accumulate_candidates.
void check_candidates() {
  const int64_t sizes[] = {0, 1, 31, 33, 255, 257, 4095, 4096, 4097, 12289};
  const float thresholds[] = {1.0f, 0.0f, INFINITY, 0.01f, 64.0f};
  int k = 0;
  for_each_dtype([&]<typename T>(T) {
    for (int64_t n : sizes) {
      Rng r{uint64_t(n) * 43 + sizeof(T)};
      {  // one case per (dtype, size): the state and the threshold rotate (ThreadSanitizer's time)
        const FeedbackCase& fc = kFeedback[size_t(k++) % std::size(kFeedback)];
        const float t = thresholds[size_t(n + sizeof(T)) % std::size(thresholds)];
        set_case("accumulate_count+compact_candidates<%s> numel=%lld threshold=%g feedback=%s", type_name<T>(),
                 (long long)n, t, fc.name);
        const std::vector<T> grad = random_vector<T>(n, r);
        FeedbackBuffers state(fc, n, r);
        const Feedback fb = state.cuda();
        const std::vector<float> threshold{t};
        const int64_t tiles = sc::cuda::candidate_tiles(n);
        std::vector<int32_t> counts(size_t(tiles), -1);
        sc::cuda::accumulate_count<T>(grad.data(), fb, n, threshold.data(), counts.data(), nullptr);
        std::vector<int64_t> offsets(static_cast<size_t>(tiles));
        int64_t total = 0;
        for (int64_t k = 0; k < tiles; ++k) {
          offsets[size_t(k)] = total;
          total += counts[size_t(k)];
        }
        std::vector<float> cuda_acc(static_cast<size_t>(total));
        std::vector<int32_t> cuda_index(static_cast<size_t>(total));
        if (const float* source = fb.residual_out ? fb.residual_out : fb.momentum_out)
          sc::cuda::compact_candidates<float>(source, n, threshold.data(), offsets.data(), cuda_acc.data(),
                                              cuda_index.data(), nullptr);
        else
          sc::cuda::compact_candidates<T>(grad.data(), n, threshold.data(), offsets.data(), cuda_acc.data(),
                                          cuda_index.data(), nullptr);
        std::vector<float> cpu_acc;
        std::vector<int32_t> cpu_index;
        sc::cpu::accumulate_candidates<T>(grad.data(), state.cpu(), n, t, cpu_acc, cpu_index);
        std::vector<int32_t> cpu_counts(size_t(tiles), 0);
        for (int32_t i : cpu_index) ++cpu_counts[size_t(i / sc::cuda::kCandidateTile)];
        same("tile_counts", counts, cpu_counts);
        same("index", cuda_index, cpu_index);
        same("acc", cuda_acc, cpu_acc);
        state.compare();
      }
    }
  });
}

// A bucket's sampled packs over a table of segments (segments.cu, and wire.cu's wire_segments)
// against each tensor alone through the launchers checked above (the glue of csrc/torch/cuda.cpp),
// bit for bit: thresholds, counts, candidates, states, sends and wire rows. A FeedbackBuffers'
// "cuda" side is the bucket's, its "cpu" side the tensor's. Sizes: empty, tiny, several tiles,
// and a sample of 9,000 (three blocks of digit counts); every dtype in one bucket.
struct BucketTensor {
  int64_t numel;
  int dtype;  // 0 float32, 1 float16, 2 bfloat16
  std::vector<uint8_t> grad;
  FeedbackBuffers state;
  sc::SamplePlan plan;
  float fixed;
};

template <typename F>
void with_dtype(int dtype, F f) {
  if (dtype == 1) f(half16{});
  else if (dtype == 2) f(bfloat16{});
  else f(float{});
}

// One tensor alone: its threshold, candidates, send and rows.
struct Alone {
  float threshold;
  std::vector<float> acc;
  std::vector<int32_t> index;
  std::vector<uint8_t> values, rows;
};

template <typename T>
Alone pack_alone(BucketTensor& t) {
  Alone a;
  const Feedback fb = t.state.cpu();
  const T* grad = reinterpret_cast<const T*>(t.grad.data());
  std::vector<float> scratch(static_cast<size_t>(sc::cuda::sample_scratch_floats(t.plan.count)));
  a.threshold = t.fixed;
  if (t.plan.count > 0) sc::cuda::sample_threshold<T>(grad, fb, t.numel, t.plan, scratch.data(), &a.threshold, nullptr);
  const int64_t tiles = sc::cuda::candidate_tiles(t.numel);
  std::vector<int32_t> counts(static_cast<size_t>(tiles));
  sc::cuda::accumulate_count<T>(grad, fb, t.numel, &a.threshold, counts.data(), nullptr);
  std::vector<int64_t> offsets(static_cast<size_t>(tiles));
  int64_t total = 0;
  for (int64_t k = 0; k < tiles; ++k) offsets[size_t(k)] = total, total += counts[size_t(k)];
  a.acc.resize(size_t(total));
  a.index.resize(size_t(total));
  if (const float* source = fb.residual_out ? fb.residual_out : fb.momentum_out)
    sc::cuda::compact_candidates<float>(source, t.numel, &a.threshold, offsets.data(), a.acc.data(), a.index.data(), nullptr);
  else
    sc::cuda::compact_candidates<T>(grad, t.numel, &a.threshold, offsets.data(), a.acc.data(), a.index.data(), nullptr);
  Feedback send = fb;
  send.masking = true;
  a.values.resize(size_t(total) * sizeof(T));
  sc::cuda::send_selected<T>(a.acc.data(), a.index.data(), total, send, reinterpret_cast<T*>(a.values.data()), nullptr);
  a.rows.resize(size_t((total + sc::wire_buckets(0, t.numel)) * int64_t(2 + sizeof(T))));
  sc::cuda::wire_rows(a.values.data(), sizeof(T), a.index.data(), total, 0, t.numel, a.rows.data(), nullptr);
  return a;
}

void check_segments() {
  const int64_t sizes[] = {4097, 0, 33, 9000, 1, 257};
  const int64_t wanted[] = {60, 1, 33, 9000, 1, 8};
  Rng r{4242};
  std::vector<BucketTensor> tensors;
  std::vector<sc::cuda::Segment> segments;
  int64_t samples = 0, blocks = 0, tiles = 0;
  for (size_t p = 0; p < std::size(sizes); ++p) {
    const int64_t n = sizes[p];
    const int dtype = int(p % 3);
    std::vector<uint8_t> grad;
    with_dtype(dtype, [&]<typename T>(T) {
      const std::vector<T> g = random_vector<T>(n, r);
      grad.assign(reinterpret_cast<const uint8_t*>(g.data()), reinterpret_cast<const uint8_t*>(g.data() + n));
    });
    const sc::SamplePlan plan = p % 2 ? sc::SamplePlan() : sc::plan_sample(n, wanted[p], 0.05, r.next(), uint32_t(p), 3);
    tensors.push_back({n, dtype, grad, FeedbackBuffers(kFeedback[(p + 1) % std::size(kFeedback)], n, r), plan,
                       p == 1 ? INFINITY : 0.5f});
  }
  for (BucketTensor& t : tensors) {
    sc::cuda::Segment s;
    s.grad = t.grad.data(), s.grad_type = sc::cuda::FloatType(t.dtype), s.fb = t.state.cuda(), s.numel = t.numel;
    s.plan = t.plan, s.fixed = t.fixed, s.sample_at = samples, s.block_at = blocks, s.tile_at = tiles;
    samples += t.plan.count, blocks += sc::cuda::digit_blocks(t.plan.count), tiles += sc::cuda::candidate_tiles(t.numel);
    segments.push_back(s);
  }
  set_case("segments: a bucket of %zu tensors, %lld samples, %lld tiles", tensors.size(), (long long)samples,
           (long long)tiles);
  const int64_t n = int64_t(segments.size());
  std::vector<float> sample(static_cast<size_t>(samples)), thresholds(size_t(n), -1.0f);
  std::vector<sc::cuda::SelectState> states(static_cast<size_t>(n));
  std::vector<int32_t> tile_counts(static_cast<size_t>(tiles));
  std::vector<int64_t> inclusive(static_cast<size_t>(tiles)), totals(size_t(n), -1);
  sc::cuda::sample_segments(segments.data(), n, samples, blocks, sample.data(), states.data(), thresholds.data(), nullptr);
  sc::cuda::count_segments(segments.data(), n, tiles, thresholds.data(), tile_counts.data(), nullptr);
  std::partial_sum(tile_counts.begin(), tile_counts.end(), inclusive.begin());
  sc::cuda::segment_totals(segments.data(), n, inclusive.data(), totals.data(), nullptr);
  const int64_t all = tiles ? inclusive.back() : 0;
  std::vector<float> acc(static_cast<size_t>(all));
  std::vector<int32_t> index(static_cast<size_t>(all));
  sc::cuda::compact_segments(segments.data(), n, tiles, thresholds.data(), tile_counts.data(), inclusive.data(), totals.data(),
                             acc.data(), index.data(), nullptr);
  std::vector<sc::cuda::SendSegment> sends;
  std::vector<sc::cuda::WireSegment> wires;
  std::vector<std::vector<uint8_t>> values(tensors.size()), rows(tensors.size());
  int64_t at = 0, sent = 0, written = 0;
  for (size_t p = 0; p < tensors.size(); ++p) {
    const int64_t bytes = tensors[p].dtype ? 2 : 4, count = totals[p];
    values[p].resize(size_t(count * bytes));
    rows[p].resize(size_t((count + sc::wire_buckets(0, tensors[p].numel)) * (2 + bytes)));
    sc::cuda::SendSegment d;
    d.acc = acc.data() + at, d.index = index.data() + at, d.count = count, d.at = sent;
    d.fb = tensors[p].state.cuda(), d.fb.masking = true;
    d.values = values[p].data(), d.value_type = sc::cuda::FloatType(tensors[p].dtype);
    sends.push_back(d);
    sc::cuda::WireSegment w;
    w.values = values[p].data(), w.index = d.index, w.value_bytes = bytes, w.count = count;
    w.buckets = sc::wire_buckets(0, tensors[p].numel);
    w.at = written, w.rows = rows[p].data();
    wires.push_back(w);
    at += count, sent += count, written += count + sc::wire_buckets(0, tensors[p].numel);
  }
  sc::cuda::send_segments(sends.data(), n, sent, nullptr);
  sc::cuda::wire_segments(wires.data(), n, written, nullptr);
  at = 0;
  for (size_t p = 0; p < tensors.size(); ++p) {
    set_case("segments: tensor %zu of the bucket (%s, numel=%lld, sample %lld)", p,
             tensors[p].dtype == 0 ? "float32" : tensors[p].dtype == 1 ? "float16" : "bfloat16",
             (long long)tensors[p].numel, (long long)tensors[p].plan.count);
    Alone alone;
    with_dtype(tensors[p].dtype, [&]<typename T>(T) { alone = pack_alone<T>(tensors[p]); });
    same_value("threshold", thresholds[p], alone.threshold);
    const auto from = acc.begin() + at, to = from + totals[p];
    same("acc", std::vector<float>(from, to), alone.acc, "bucket", "alone");
    same("index", std::vector<int32_t>(index.begin() + at, index.begin() + at + totals[p]), alone.index, "bucket", "alone");
    same("values", values[p], alone.values, "bucket", "alone");
    same("rows", rows[p], alone.rows, "bucket", "alone");
    tensors[p].state.compare();
    at += totals[p];
  }
}

// A bucket's top k of candidate lists (top_segments, a block a list) against cpu::select_top,
// list by list: ties at the k-th magnitude (NaN as +inf, -0 as 0) go to the lower position.
void check_top_segments() {
  Rng r{777};
  std::vector<std::vector<float>> accs;
  for (int64_t n : {300, 0, 1, 4097, 64, 9}) accs.push_back(random_floats(n, r));
  accs.push_back({1.0f, -1.0f, NAN, INFINITY, -0.0f, 0.0f, -INFINITY, 1.0f, 2.0f, -1.0f, NAN, 0.0f});
  const int64_t ks[] = {30, 0, 1, 41, 64, 0, 5};  // (k = count: every one; 0: none)
  std::vector<std::vector<int32_t>> indices;
  std::vector<std::vector<float>> acc_tops;
  std::vector<std::vector<int32_t>> index_tops;
  std::vector<sc::cuda::TopSegment> tops;
  for (size_t p = 0; p < accs.size(); ++p) {
    const int64_t n = int64_t(accs[p].size()), kept = std::min(n, ks[p]);
    indices.push_back(distinct_sorted(n, 3 * n + 1, r));
    acc_tops.emplace_back(static_cast<size_t>(kept), -1.0f);
    index_tops.emplace_back(static_cast<size_t>(kept), -1);
  }
  for (size_t p = 0; p < accs.size(); ++p) {
    sc::cuda::TopSegment t;
    t.acc = accs[p].data(), t.index = indices[p].data(), t.count = int64_t(accs[p].size()), t.k = ks[p];
    t.acc_top = acc_tops[p].data(), t.index_top = index_tops[p].data();
    tops.push_back(t);
  }
  sc::cuda::top_segments(tops.data(), int64_t(tops.size()), nullptr);
  for (size_t p = 0; p < accs.size(); ++p) {
    set_case("top_segments: list %zu of %zu candidates, k=%lld", p, accs[p].size(), (long long)ks[p]);
    std::vector<float> acc = accs[p];
    std::vector<int32_t> index = indices[p];
    const int64_t kept = sc::cpu::select_top(acc.data(), index.data(), int64_t(acc.size()), ks[p]);
    acc.resize(size_t(kept));
    index.resize(size_t(kept));
    same("acc", acc_tops[p], acc);
    same("index", index_tops[p], index);
  }
}

// A bucket's selections at fixed capacity (fixed_tops, a block a tensor), each band decision
// against cpu::select_top of what it should select from: the candidates as they are (inside), their
// top k (above), every element's top k (below, or more candidates than the room holds).
struct FixedCase {
  const char* decision;
  int64_t numel, count, room, k, too_few, too_many;
  bool from_every;
};
constexpr FixedCase kFixedCases[] = {
    {"inside", 1000, 50, 120, 50, 40, 65, false},       {"above", 1000, 100, 200, 30, 24, 39, false},
    {"past its room", 1000, 300, 200, 30, 24, 39, true}, {"below", 1000, 10, 120, 30, 24, 39, true},
    {"k = 0", 1000, 7, 120, 0, 0, -1, false},           {"empty", 0, 0, 0, 0, 0, -1, false},
    {"ties, NaN, +-0 below", 12, 0, 12, 5, 4, 6, true},
};

void check_fixed_tops() {
  Rng r{778};
  const size_t n = std::size(kFixedCases);
  std::vector<std::vector<float>> everys, accs, acc_tops(n);
  std::vector<std::vector<int32_t>> indices, index_tops(n);
  std::vector<int64_t> totals, counts(n, -1);
  std::vector<sc::cuda::FixedTop> tops;
  for (const FixedCase& c : kFixedCases) {
    everys.push_back(c.numel == 12 ? std::vector<float>{1.0f, -1.0f, NAN, INFINITY, -0.0f, 0.0f, -INFINITY, 1.0f, 2.0f,
                                                        -1.0f, NAN, 0.0f}
                                   : random_floats(c.numel, r));
    const int64_t written = std::min(c.count, c.room);
    accs.push_back(random_floats(written, r));
    indices.push_back(distinct_sorted(written, c.numel, r));
    totals.push_back(c.count);
  }
  for (size_t p = 0; p < n; ++p) {
    const FixedCase& c = kFixedCases[p];
    acc_tops[p].assign(size_t(std::max(c.k, c.too_many)), -1.0f);
    index_tops[p].assign(acc_tops[p].size(), -1);
    sc::cuda::FixedTop t;
    t.acc = accs[p].data(), t.index = indices[p].data(), t.room = c.room;
    t.k = c.k, t.too_few = c.too_few, t.too_many = c.too_many;
    t.every = everys[p].data(), t.numel = c.numel;
    t.acc_top = acc_tops[p].data(), t.index_top = index_tops[p].data();
    tops.push_back(t);
  }
  sc::cuda::fixed_tops(tops.data(), int64_t(n), totals.data(), counts.data(), nullptr);
  for (size_t p = 0; p < n; ++p) {
    const FixedCase& c = kFixedCases[p];
    set_case("fixed_tops: %s (numel=%lld, %lld candidates, k=%lld)", c.decision, (long long)c.numel,
             (long long)c.count, (long long)c.k);
    std::vector<float> acc = c.from_every ? everys[p] : accs[p];
    std::vector<int32_t> index(acc.size());
    if (c.from_every)
      std::iota(index.begin(), index.end(), 0);
    else
      index = indices[p];
    const bool inside = !c.from_every && c.count <= c.too_many;
    const int64_t kept = sc::cpu::select_top(acc.data(), index.data(), int64_t(acc.size()), inside ? c.count : c.k);
    acc.resize(size_t(kept));
    index.resize(size_t(kept));
    same("count", std::vector<int64_t>{counts[p]}, std::vector<int64_t>{kept});
    same("acc", std::vector<float>(acc_tops[p].begin(), acc_tops[p].begin() + kept), acc);
    same("index", std::vector<int32_t>(index_tops[p].begin(), index_tops[p].begin() + kept), index);
  }
}

// The send-side state: residual_out and momentum_out of the tensor, each present or not. Both
// sides start equal: only the sent elements may change.
struct SendState {
  std::vector<float> cuda_residual, cpu_residual, cuda_momentum, cpu_momentum;
  bool residual, momentum, masking;
  SendState(int64_t numel, int variant, Rng& r)
      : residual(variant & 1), momentum(variant & 2), masking(variant & 4) {
    if (residual) cuda_residual = cpu_residual = random_floats(numel, r);
    if (momentum) cuda_momentum = cpu_momentum = random_floats(numel, r);
  }
  Feedback fb(bool cuda) {
    Feedback fb;
    fb.residual_out = residual ? (cuda ? cuda_residual : cpu_residual).data() : nullptr;
    fb.momentum_out = momentum ? (cuda ? cuda_momentum : cpu_momentum).data() : nullptr;
    fb.masking = masking;
    return fb;
  }
  void compare() {
    same("residual", cuda_residual, cpu_residual);
    same("momentum", cuda_momentum, cpu_momentum);
  }
};

void check_send_selected() {
  for_each_dtype([]<typename T>(T) {
    for (int64_t count : kSizes) {
      Rng r{uint64_t(count) * 47 + sizeof(T)};
      for (int v : {int(count + sizeof(T)) % 8, int(count + sizeof(T) + 3) % 8}) {
        const int64_t numel = 2 * count + 3;
        SendState state(numel, v, r);
        set_case("send_selected<%s> count=%lld numel=%lld residual=%d momentum=%d masking=%d", type_name<T>(),
                 (long long)count, (long long)numel, state.residual, state.momentum, state.masking);
        const std::vector<float> acc = random_floats(count, r);
        const std::vector<int32_t> index = distinct_sorted(count, numel, r);
        std::vector<T> cuda_values = random_vector<T>(count, r), cpu_values = random_vector<T>(count, r);
        sc::cuda::send_selected<T>(acc.data(), index.data(), count, state.fb(true), cuda_values.data(), nullptr);
        sc::cpu::send_selected<T>(acc.data(), index.data(), count, state.fb(false), cpu_values.data());
        same("values", cuda_values, cpu_values);
        state.compare();
      }
    }
  });
}

void check_accumulate() {  // the state's pass with nothing selected (random-k before its gather)
  int k = 0;
  for_each_dtype([&]<typename T>(T) {
    for (int64_t n : kSizes) {
      Rng r{uint64_t(n) * 61 + sizeof(T)};
      const FeedbackCase& fc = kFeedback[size_t(k++) % std::size(kFeedback)];  // rotates (ThreadSanitizer's time)
      set_case("accumulate<%s> numel=%lld feedback=%s", type_name<T>(), (long long)n, fc.name);
      const std::vector<T> grad = random_vector<T>(n, r);
      FeedbackBuffers state(fc, n, r);
      sc::cuda::accumulate<T>(grad.data(), state.cuda(), n, nullptr);
      sc::cpu::accumulate<T>(grad.data(), state.cpu(), n);
      state.compare();
    }
  });
}

void check_momentum_step() {  // DGC's dense route: the momentum and the payload, element by element
  for_each_dtype([]<typename T>(T) {
    for (int64_t n : kSizes) {
      Rng r{uint64_t(n) * 59 + sizeof(T)};
      const bool in_place = n % 2 == 0;  // torch writes the gradient; TF writes another buffer
      const FeedbackCase& fc = kFeedback[n % 3 == 0 ? 5 : 3];  // momentum in place, no residual; scaled or not
      set_case("momentum_step<%s> numel=%lld %s feedback=%s", type_name<T>(), (long long)n,
               in_place ? "in place" : "grad -> out", fc.name);
      const std::vector<T> grad = random_vector<T>(n, r);
      std::vector<T> cuda_out = in_place ? grad : random_vector<T>(n, r), cpu_out = cuda_out;
      FeedbackBuffers state(fc, n, r);
      sc::cuda::momentum_step<T>(in_place ? cuda_out.data() : grad.data(), state.cuda(), n, cuda_out.data(), nullptr);
      sc::cpu::momentum_step<T>(in_place ? cpu_out.data() : grad.data(), state.cpu(), n, cpu_out.data());
      same("out", cuda_out, cpu_out);
      state.compare();
    }
  });
}

// A bucket's dense momentum steps (segments.cu's momentum_segments) against cpu::momentum_step of
// each gradient: every dtype, empty and tiny ones, scaled or not, in place.
void check_momentum_segments() {
  const int64_t sizes[] = {4097, 0, 33, 9000, 1};
  std::vector<FeedbackBuffers> states;
  states.reserve(std::size(sizes));  // (a Feedback points at its buffers' scale: no reallocation)
  std::vector<std::vector<uint8_t>> cuda_grads, cpu_grads;
  std::vector<sc::cuda::MomentumSegment> table;
  int64_t total = 0;
  for (size_t p = 0; p < std::size(sizes); ++p) {
    Rng r{uint64_t(sizes[p]) * 67 + p};
    states.emplace_back(kFeedback[p % 2 == 0 ? 5 : 3], sizes[p], r);  // momentum in place, scaled or not
    with_dtype(int(p % 3), [&](auto tag) {
      const auto grad = random_vector<decltype(tag)>(sizes[p], r);
      const auto* bytes = reinterpret_cast<const uint8_t*>(grad.data());
      cuda_grads.emplace_back(bytes, bytes + grad.size() * sizeof(decltype(tag)));
    });
  }
  cpu_grads = cuda_grads;
  for (size_t p = 0; p < std::size(sizes); ++p) {
    sc::cuda::MomentumSegment m;
    m.grad = cuda_grads[p].data();
    m.grad_type = sc::cuda::FloatType(p % 3);
    m.fb = states[p].cuda();
    m.at = total, total += sizes[p];
    table.push_back(m);
  }
  set_case("momentum_segments: a bucket of %zu gradients, %lld elements", table.size(), (long long)total);
  sc::cuda::momentum_segments(table.data(), int64_t(table.size()), total, nullptr);
  for (size_t p = 0; p < std::size(sizes); ++p) {
    set_case("momentum_segments: gradient %zu of the bucket (numel=%lld)", p, (long long)sizes[p]);
    with_dtype(int(p % 3), [&](auto tag) {
      using T = decltype(tag);
      T* grad = reinterpret_cast<T*>(cpu_grads[p].data());
      sc::cpu::momentum_step<T>(grad, states[p].cpu(), sizes[p], grad);
    });
    same("out", cuda_grads[p], cpu_grads[p]);
    states[p].compare();
  }
}

void check_sum_of_squares() {  // one fixed order: the CPU's bits for every tile and lane count
  for_each_dtype([]<typename T>(T) {
    // a lane's first row, part and whole tiles, a tail tile, and 4 tiles on the test build's 3
    // blocks (the grid-stride loop). More tiles than lanes (the second level's rows) for float32
    // and under ASan only: it takes seconds under TSan, and adds no new barrier pattern.
    std::vector<int64_t> sizes = {0, 1, 255, 257, 4096, 4097, 12289};
#if !defined(__SANITIZE_THREAD__)
    if (std::is_same_v<T, float>) sizes.push_back(257 * sc::kSquareTile + 3);
#endif
    for (int64_t n : sizes)
      for (bool with_nan : {false, true}) {
        if (with_nan && !(std::is_same_v<T, float> && n == 12289)) continue;
        Rng r{uint64_t(n) * 61 + sizeof(T) + with_nan};
        set_case("sum_of_squares<%s> numel=%lld%s", type_name<T>(), (long long)n, with_nan ? " with a NaN" : "");
        std::vector<T> x(static_cast<size_t>(n));
        for (T& v : x)  // finite: NaN and infinities would hide every other bit
          v = sc::from_float<T>(float(std::ldexp(r.below(2) ? 1.0 + r.uniform() : -1.0 - r.uniform(),
                                                 int(r.below(25)) - 12)));
        if (with_nan) x[size_t(r.below(n))] = sc::from_float<T>(std::nanf(""));
        // one more slot than the tiles, whose -1 must stay: nothing is written past them
        std::vector<double> cuda_tiles(size_t(sc::square_tiles(n) + 1), -1.0), cpu_tiles = cuda_tiles;
        double cuda_sum = -1.0, cpu_sum = -2.0;
        sc::cuda::sum_of_squares<T>(x.data(), n, cuda_tiles.data(), &cuda_sum, nullptr);
        sc::cpu::sum_of_squares<T>(x.data(), n, cpu_tiles.data(), &cpu_sum);
        if (with_nan) {
          if (!std::isnan(cuda_sum) || !std::isnan(cpu_sum)) fail("sum: cuda %g, cpu %g, want NaN", cuda_sum, cpu_sum);
        } else {
          same("sum", std::vector<double>{cuda_sum}, std::vector<double>{cpu_sum});
          same("tile_sums", cuda_tiles, cpu_tiles);
        }
        if (cuda_tiles.back() != -1.0 || cpu_tiles.back() != -1.0) fail("a write past the tiles' sums");
      }
  });
}

void check_send_quantized() {
  const int64_t counts[] = {0, 1, 33, 511, 513, 4097};  // the kernel is one block of 512 threads
  for (int bits : {1, 2})
    for (int64_t count : counts) {
      Rng r{uint64_t(count) * 53 + bits};
      const int64_t numel = count + 5;
      SendState state(numel, int(count + bits) % 8, r);
      set_case("send_quantized bits=%d count=%lld numel=%lld residual=%d momentum=%d masking=%d", bits,
               (long long)count, (long long)numel, state.residual, state.momentum, state.masking);
      const std::vector<float> acc = random_floats(count, r);
      const std::vector<int32_t> index = distinct_sorted(count, numel, r);
      const size_t bytes = size_t(sc::quantized_bytes(count, bits)), scales = size_t(sc::quantized_scales(bits));
      std::vector<uint8_t> cuda_codes(bytes, 0xa5), cpu_codes(bytes, 0x5a);
      std::vector<float> cuda_scales(scales, -1.0f), cpu_scales(scales, -2.0f);
      sc::cuda::send_quantized(acc.data(), index.data(), count, state.fb(true), bits, cuda_codes.data(),
                               cuda_scales.data(), nullptr);
      sc::cpu::send_quantized(acc.data(), index.data(), count, state.fb(false), bits, cpu_codes.data(),
                              cpu_scales.data());
      same("scales", cuda_scales, cpu_scales);
      same("codes", cuda_codes, cpu_codes);
      state.compare();
    }
}

// A bucket's quantized sends at fixed capacity: a block a tensor (fewer blocks than tensors: the
// grid-stride loop reuses each block's shared memory), each at its count of its room, against
// send_quantized tensor by tensor. Nothing is written past a count's codes.
void check_quantize_segments() {
  const int64_t counts[] = {0, 1, 33, 511, 513, 4097, 7};
  for (int bits : {1, 2}) {
    Rng r{uint64_t(bits) * 71};
    set_case("quantize_segments bits=%d, %zu tensors", bits, std::size(counts));
    std::vector<SendState> states;
    std::vector<std::vector<float>> accs;
    std::vector<std::vector<int32_t>> indices;
    std::vector<int64_t> limits;
    for (int64_t count : counts) {  // a room of count + 9: garbage past each count
      states.emplace_back(count + 20, int(count + bits) % 8, r);
      accs.push_back(random_floats(count + 9, r));
      indices.push_back(distinct_sorted(count + 9, count + 20, r));
      limits.push_back(count);
    }
    const size_t n = std::size(counts), bytes = size_t(sc::quantized_bytes(4097 + 9, bits));
    std::vector<std::vector<uint8_t>> cuda_codes(n, std::vector<uint8_t>(bytes, 0xa5)), cpu_codes = cuda_codes;
    std::vector<std::vector<float>> cuda_scales(n, std::vector<float>(4, -1.0f)), cpu_scales = cuda_scales;
    std::vector<sc::cuda::QuantizeSegment> table(n);
    for (size_t s = 0; s < n; ++s) {
      table[s].acc = accs[s].data(), table[s].index = indices[s].data(), table[s].limit = &limits[s];
      table[s].fb = states[s].fb(true), table[s].codes = cuda_codes[s].data(), table[s].scales = cuda_scales[s].data();
      sc::cpu::send_quantized(accs[s].data(), indices[s].data(), limits[s], states[s].fb(false), bits,
                              cpu_codes[s].data(), cpu_scales[s].data());
    }
    sc::cuda::quantize_segments(table.data(), int64_t(n), bits, nullptr);
    for (size_t s = 0; s < n; ++s) {
      same("scales", cuda_scales[s], cpu_scales[s]);
      same("codes", cuda_codes[s], cpu_codes[s]);
      states[s].compare();
    }
  }
}

// Every "rank's" entries of the fixed segments of `sends` (two ranks: the bucket twice), against the
// CPU's dequantize and segment_index up to each count, -0.0 at the tensor's first place past it.
void check_segment_entries(const std::vector<sc::FixedSegmentSend>& sends, int bits) {
  std::vector<sc::cuda::SegmentRead> reads;
  int64_t buckets = 0, entries = 0, place = 0;
  std::vector<float> cpu_values;
  std::vector<int32_t> cpu_places;
  for (int rank = 0; rank < 2; ++rank, place = 0)
    for (const sc::FixedSegmentSend& s : sends) {
      sc::cuda::SegmentRead read;
      read.segment = s.segment, read.room = s.room, read.buckets = s.buckets;
      read.bucket_at = buckets, read.at = entries, read.place = place;
      reads.push_back(read);
      const sc::QuantizedSegment layout(s.room, bits, s.buckets);
      std::vector<float> values(size_t(s.room), -0.0f);
      std::vector<int32_t> index(size_t(s.room), 0);
      sc::cpu::dequantize(s.segment + layout.codes_at, reinterpret_cast<const float*>(s.segment + layout.scales_at),
                          *s.count, bits, values.data());
      if (!sc::cpu::segment_index(s.segment + layout.counts_at, s.buckets, s.segment + layout.offsets_at, *s.count,
                                  index.data()))
        fail("segment_index: the bucket counts do not add up");
      for (int32_t& i : index) i += int32_t(place);
      cpu_values.insert(cpu_values.end(), values.begin(), values.end());
      cpu_places.insert(cpu_places.end(), index.begin(), index.end());
      buckets += s.buckets, entries += s.room, place += s.buckets * sc::kWireBucket;
    }
  std::vector<int64_t> starts(static_cast<size_t>(buckets));
  std::vector<float> cuda_values(size_t(entries), 1.0f);
  std::vector<int32_t> cuda_places(size_t(entries), -1);
  sc::cuda::segment_starts(reads.data(), int64_t(reads.size()), bits, starts.data(), nullptr);
  sc::cuda::segment_entries(reads.data(), int64_t(reads.size()), entries, bits, starts.data(), cuda_values.data(),
                            cuda_places.data(), nullptr);
  same("values", cuda_values, cpu_values);
  same("places", cuda_places, cpu_places);
}

// A bucket's fixed segments (over bytes that must stay where nothing is written), against the CPU
// launcher's (the same items); then read back (check_segment_entries).
void check_fixed_segments() {
  struct Tensor {
    int64_t room, count, numel;
  };
  const Tensor tensors[] = {{0, 0, 0}, {5, 1, 5}, {300, 300, 300}, {3000, 2000, 140000}, {40, 0, 70000}};
  for (int bits : {1, 2}) {
    Rng r{uint64_t(bits) * 73};
    set_case("fixed_segments bits=%d", bits);
    std::vector<std::vector<uint8_t>> codes;
    std::vector<std::vector<float>> scales;
    std::vector<std::vector<int32_t>> indices;
    std::vector<int64_t> counts, at;
    int64_t bytes = 0;
    for (const Tensor& t : tensors) {
      codes.emplace_back(size_t(sc::quantized_bytes(t.room, bits)));
      for (uint8_t& c : codes.back()) c = uint8_t(r.next());
      scales.push_back(random_floats(sc::quantized_scales(bits), r));
      indices.push_back(distinct_sorted(t.count, t.numel, r));
      indices.back().resize(size_t(t.room), int32_t(r.next()));  // garbage past the count
      counts.push_back(t.count);
      at.push_back(bytes);
      bytes += sc::QuantizedSegment(t.room, bits, sc::wire_buckets(0, t.numel)).size;
    }
    std::vector<uint8_t> cuda_chunk(size_t(bytes + 8 * std::size(tensors)), 0xa5), cpu_chunk = cuda_chunk;
    std::vector<sc::FixedSegmentSend> cuda_sends, cpu_sends;
    int64_t items = 0;
    for (size_t p = 0; p < std::size(tensors); ++p)
      for (auto* sends : {&cuda_sends, &cpu_sends}) {
        std::vector<uint8_t>& chunk = sends == &cuda_sends ? cuda_chunk : cpu_chunk;
        sc::FixedSegmentSend s;
        s.codes = codes[p].data(), s.scales = scales[p].data(), s.index = indices[p].data(), s.count = &counts[p];
        s.room = tensors[p].room, s.buckets = sc::wire_buckets(0, tensors[p].numel), s.bits = bits;
        s.segment = chunk.data() + 8 * std::size(tensors) + at[p], s.header = chunk.data() + 8 * p, s.at = items;
        sends->push_back(s);
        if (sends == &cpu_sends) items += sc::fixed_segment_items(s);
      }
    sc::cuda::fixed_segments(cuda_sends.data(), int64_t(cuda_sends.size()), items, nullptr);
    if (sc::cpu::fixed_segments(cpu_sends.data(), int64_t(cpu_sends.size())) != -1) fail("cpu: a send refused");
    same("chunk", cuda_chunk, cpu_chunk);
    check_segment_entries(cpu_sends, bits);
  }
}

// Not in the default run: a known divergence (tests/test_cuda_emulation.py expects it to fail).
// The CPU sums the class in index order, the CUDA kernel in 512 strided partial sums and a
// tree. Within a class all values have one sign, so the double sums differ by a few units in
// the last place of a double only, but the mean can sit on a float rounding tie: here the CPU
// mean is exactly 2^38 + 2^14 (a tie, to even: 2^38), the CUDA one 2^-14 above it (2^38 + 2^15).
void check_send_quantized_order() {
  set_case("send_quantized bits=1 acc={2^-13, 2^40, 2^-13, 2^16} (summation order)");
  const std::vector<float> acc{0x1p-13f, 0x1p40f, 0x1p-13f, 0x1p16f};
  const std::vector<int32_t> index{0, 1, 2, 3};
  std::vector<uint8_t> cuda_codes(1), cpu_codes(1);
  std::vector<float> cuda_scales(2), cpu_scales(2);
  sc::cuda::send_quantized(acc.data(), index.data(), 4, Feedback{}, 1, cuda_codes.data(), cuda_scales.data(), nullptr);
  sc::cpu::send_quantized(acc.data(), index.data(), 4, Feedback{}, 1, cpu_codes.data(), cpu_scales.data());
  same("codes", cuda_codes, cpu_codes);
  same("scales", cuda_scales, cpu_scales);
}

void check_dequantize() {
  for (int bits : {1, 2})
    for (int64_t count : kSizes) {
      Rng r{uint64_t(count) * 59 + bits};
      set_case("dequantize bits=%d count=%lld", bits, (long long)count);
      std::vector<uint8_t> codes(static_cast<size_t>(sc::quantized_bytes(count, bits)));
      for (uint8_t& c : codes) c = uint8_t(r.next());
      const std::vector<float> scales = random_floats(sc::quantized_scales(bits), r);
      std::vector<float> cuda_values = random_floats(count, r), cpu_values = random_floats(count, r);
      sc::cuda::dequantize(codes.data(), scales.data(), count, bits, cuda_values.data(), nullptr);
      sc::cpu::dequantize(codes.data(), scales.data(), count, bits, cpu_values.data());
      same("values", cuda_values, cpu_values);
    }
}

// The values of 3 ranks, concatenated: duplicates add in input order. CUDA's glue (as in
// csrc/torch/cuda.cpp): zero the output, stable-sort the indices, then the kernel. The second
// case of each size reads its scale where the kernel runs (Horovod's reduced placeholder / ranks).
void check_sparse_unpack() {
  const float scales[] = {1.0f, 0.5f, 1.0f / 3.0f};
  const float reduced[] = {1.0f, 3.0f, 6.0f};
  for_each_dtype([&]<typename T>(T) {
    for (int64_t numel : kSizes) {
      Rng r{uint64_t(numel) * 61 + sizeof(T)};
      for (int s = 0; s < 2; ++s) {
        const int64_t per_rank = numel ? 1 + r.below(std::min<int64_t>(numel, 2 + numel / 4)) : 0;
        std::vector<int32_t> index;
        for (int rank = 0; rank < 3; ++rank)
          for (int32_t i : distinct_sorted(per_rank, numel, r)) index.push_back(i);
        const int64_t count = int64_t(index.size());
        const sc::UnpackScale scale = s == 0 ? sc::UnpackScale(scales[size_t(numel) % std::size(scales)])
                                             : sc::UnpackScale(&reduced[size_t(numel) % std::size(reduced)], 3);
        set_case("sparse_unpack_sorted<%s> numel=%lld count=%lld (3 ranks) scale=%g (%s)", type_name<T>(),
                 (long long)numel, (long long)count, scale.value(), s == 0 ? "a number" : "read by the kernel");
        const std::vector<T> values = random_vector<T>(count, r);
        std::vector<int64_t> order(static_cast<size_t>(count));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return index[size_t(a)] < index[size_t(b)]; });
        std::vector<int32_t> sorted_index(static_cast<size_t>(count));
        for (int64_t p = 0; p < count; ++p) sorted_index[size_t(p)] = index[size_t(order[size_t(p)])];
        std::vector<T> cuda_dense(size_t(numel), sc::from_float<T>(0.0f)), cpu_dense = random_vector<T>(numel, r);
        sc::cuda::sparse_unpack_sorted<T>(values.data(), sorted_index.data(), order.data(), count, scale,
                                          cuda_dense.data(), nullptr);
        sc::cpu::sparse_unpack<T>(values.data(), index.data(), count, scale.value(), numel, cpu_dense.data());
        same("dense", cuda_dense, cpu_dense);
      }
    }
  });
}

void check_random_k() {
  for (int64_t numel : kSizes) {
    Rng r{uint64_t(numel) * 67};
    const int64_t ks[] = {numel, numel / 3, numel ? 1 : 0, 0};
    for (int c = 0; c < 2; ++c) {
      const int64_t k = ks[size_t(2 * c + numel % 2)];
      const uint64_t seed = r.next(), step = r.below(1000);
      const uint32_t tensor_id = uint32_t(r.next());
      set_case("random_k_indices numel=%lld k=%lld seed=%llu tensor_id=%u step=%llu", (long long)numel,
               (long long)k, (unsigned long long)seed, tensor_id, (unsigned long long)step);
      const sc::Permutation perm(seed, tensor_id, step, numel);
      std::vector<int32_t> cuda_out(size_t(k), -1), cpu_out(size_t(k), -2);
      sc::cuda::random_k_indices(perm, k, cuda_out.data(), nullptr);
      std::sort(cuda_out.begin(), cuda_out.end());  // CUDA leaves them unsorted: the torch glue sorts
      sc::cpu::random_k_indices(perm, k, cpu_out.data());
      same("indices", cuda_out, cpu_out);
    }
  }
}

// check_launch (csrc/cuda/grid.cuh) turns a bad launch configuration into an exception naming
// the kernel. No launcher can be driven into one, so a test kernel is launched directly.
__global__ void mark_kernel(int* out) { out[threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * blockIdx.x)] = 1; }

void check_launch_errors() {
  struct Config { const char* name; dim3 grid, threads; };
  const Config bad[] = {{"1025 threads", dim3(1), dim3(1025)},
                        {"32x32x2 threads", dim3(1), dim3(32, 32, 2)},
                        {"a grid of 0 blocks", dim3(0), dim3(32)},
                        {"a grid of -1 blocks", dim3(unsigned(-1)), dim3(32)}};
  for (const Config& c : bad) {
    set_case("check_launch after mark_kernel with %s", c.name);
    std::vector<int> out(4096, 0);
    sc_emu::launch("mark_kernel", mark_kernel, c.grid, c.threads)(out.data());
    if (cudaPeekAtLastError() != cudaErrorInvalidConfiguration) fail("the emulation did not report the launch error");
    try {
      sc::cuda::check_launch("mark_kernel");
      fail("check_launch did not throw");
    } catch (const std::runtime_error& e) {
      if (!std::strstr(e.what(), "mark_kernel") || !std::strstr(e.what(), "invalid configuration argument"))
        fail("check_launch's message does not name the kernel and the error: %s", e.what());
    }
    if (std::count(out.begin(), out.end(), 0) != int64_t(out.size())) fail("the badly configured kernel ran");
    if (cudaGetLastError() != cudaSuccess) fail("check_launch did not clear the error");
  }
  set_case("check_launch after a good launch of mark_kernel");
  std::vector<int> out(3 * 64, 0);
  sc_emu::launch("mark_kernel", mark_kernel, dim3(3), dim3(32, 2))(out.data());
  sc::cuda::check_launch("mark_kernel");
  if (std::count(out.begin(), out.end(), 1) != int64_t(out.size())) fail("mark_kernel did not write every element");
}

// ---- canaries: kernels broken on purpose, to show that the checks are alive ----

__global__ void racy_count_kernel(int* out) {  // += on shared memory instead of atomicAdd
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  count += 1;
  __syncthreads();
  if (threadIdx.x == 0) *out = count;
}

__global__ void ballot_as_fence_kernel(int* out) {  // a vote orders no memory: __syncwarp is missing
  __shared__ int value;
  if (threadIdx.x == 0) value = 42;
  out[threadIdx.x] = int(__ballot_sync(0xffffffffu, 1) != 0);
  out[threadIdx.x] += value;
}

__global__ void divergent_barrier_kernel(int* out) {  // __syncthreads reached by half the block
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void overflow_kernel(int* out) { out[threadIdx.x] = 1; }  // one thread too many

int canary(const std::string& name) {
  set_case("%s", name.c_str());
  std::vector<int> out(64);
  if (name == "canary-race") sc_emu::launch("racy_count_kernel", racy_count_kernel, 1, 64)(out.data());
  else if (name == "canary-ballot") sc_emu::launch("ballot_as_fence_kernel", ballot_as_fence_kernel, 1, 32)(out.data());
  else if (name == "canary-barrier") sc_emu::launch("divergent_barrier_kernel", divergent_barrier_kernel, 1, 64)(out.data());
  else if (name == "canary-oob") sc_emu::launch("overflow_kernel", overflow_kernel, 1, 65)(out.data());
  else return std::fprintf(stderr, "unknown canary %s\n", name.c_str()), 2;
  std::printf("%s: not stopped\n", name.c_str());
  return 0;
}

struct Group {
  const char* name;
  void (*run)();
};
constexpr Group kGroups[] = {
    {"block_pack", check_block_pack},
    {"block_unpack", check_block_unpack},
    {"sample_threshold", check_sample_threshold},
    {"candidates", check_candidates},
    {"segments", check_segments},
    {"top_segments", check_top_segments},
    {"fixed_tops", check_fixed_tops},
    {"send_selected", check_send_selected},
    {"accumulate", check_accumulate},
    {"momentum_step", check_momentum_step},
    {"momentum_segments", check_momentum_segments},
    {"sum_of_squares", check_sum_of_squares},
    {"send_quantized", check_send_quantized},
    {"quantize_segments", check_quantize_segments},
    {"fixed_segments", check_fixed_segments},
    {"dequantize", check_dequantize},
    {"sparse_unpack_sorted", check_sparse_unpack},
    {"random_k_indices", check_random_k},
    {"launch_check", check_launch_errors},
};
constexpr Group kKnownDivergences[] = {
    {"send_quantized_order", check_send_quantized_order},
};

}  // namespace

int main(int argc, char** argv) {
  __sanitizer_set_death_callback(print_case);
  std::signal(SIGABRT, [](int) { print_case(); });  // the emulation's own errors abort
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.size() == 1 && names[0] == "--list") {
    for (const Group& g : kGroups) std::printf("%s\n", g.name);
    return 0;
  }
  if (names.size() == 1 && names[0].rfind("canary-", 0) == 0) return canary(names[0]);
  if (names.empty())
    for (const Group& g : kGroups) names.push_back(g.name);
  long total = 0;
  for (const std::string& name : names) {
    const Group* g = nullptr;
    for (const Group& x : kGroups) g = name == x.name ? &x : g;
    for (const Group& x : kKnownDivergences) g = name == x.name ? &x : g;
    if (!g) return std::fprintf(stderr, "unknown group %s (see --list)\n", name.c_str()), 2;
    g_cases = g_nan_payloads = 0;
    try {
      g->run();
    } catch (const std::exception& e) {
      fail("exception: %s", e.what());
    }
    std::printf("%s: %ld cases identical", g->name, g_cases);
    if (g_nan_payloads) std::printf(" (NaN payloads differed in %ld elements)", g_nan_payloads);
    std::printf("\n");
    total += g_cases;
  }
  std::printf("%ld cases identical\n", total);
  return 0;
}
