// CPU emulation of exactly the CUDA features csrc/cuda/*.cu uses, so that the kernels can be
// executed (and checked with ThreadSanitizer / AddressSanitizer) on a machine without a GPU.
// Test-only: tests/test_cuda_emulation.py compiles the .cu sources with g++ against this.
//
// Model:
//   - every CUDA thread of a block is a real OS thread (pooled std::threads), so that
//     ThreadSanitizer sees the intra-block races a GPU could have (fibers or lanes run in
//     order would hide them). With -DSC_EMU_FIBERS (x86-64; the unsanitized torch binding, which
//     checks bits, not races) they are fibers on the launching thread instead, round-robin
//     between barriers: no OS thread switch at every barrier;
//   - blocks run one after another, so a `static` variable is the block's shared memory
//     (each block in turn gets the one instance); inter-block races are NOT modelled;
//   - __syncthreads and __ballot_sync are strict barriers: every thread of the block (warp)
//     must reach the same call site, else the run aborts with both sites named. Like on a GPU,
//     only __syncthreads orders memory: ThreadSanitizer does not see the ballot's barrier;
//   - atomicAdd is a real atomic (std::atomic_ref), so replacing it with `+=` is a race;
//   - launches are synchronous, from one host thread at a time; streams are ignored; a bad
//     launch configuration is reported by cudaGetLastError like CUDA does
//     (cudaErrorInvalidConfiguration, kernel not run).
// A launch `k<<<grid, block, shared, stream>>>(args)` is written as
// `::sc_emu::launch("k", k, grid, block, shared, stream)(args)` by the test's rewrite step.
#pragma once

#include <math.h>  // CUDA's math functions live in the global namespace (fabs, ...)

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <semaphore>
#include <source_location>
#include <thread>
#include <vector>
#ifdef SC_EMU_FIBERS
#include <memory>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Blocks run one after another: one static instance serves as each block's shared memory in turn.
#define __shared__ static

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;

inline const char* cudaGetErrorString(cudaError_t err) {  // CUDA's own wording
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
  }
  return "unrecognized error code";
}

namespace sc_emu {
inline thread_local cudaError_t last_error = cudaSuccess;  // per host thread, like CUDA's
// Every kernel launch that ran: what a GPU's profiler counts, for the tests of launches per step.
inline std::atomic<int64_t> launches{0};
}  // namespace sc_emu

inline cudaError_t cudaPeekAtLastError() { return sc_emu::last_error; }
inline cudaError_t cudaGetLastError() {
  const cudaError_t err = sc_emu::last_error;
  sc_emu::last_error = cudaSuccess;
  return err;
}

// Built-in variables: per emulated thread.
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

namespace sc_emu {

// ThreadSanitizer's annotations; weak, so they are null in the AddressSanitizer build.
extern "C" {
void AnnotateIgnoreSyncBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreSyncEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char* file, int line) __attribute__((weak));
}

// While alive, this thread's synchronisation and memory accesses are hidden from
// ThreadSanitizer: the emulation's own bookkeeping for an operation that orders no memory.
struct Unobserved {
  Unobserved() {
    if (AnnotateIgnoreSyncBegin) {
      AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
      AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
      AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
  }
  ~Unobserved() {
    if (AnnotateIgnoreSyncEnd) {
      AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
      AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
      AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
  }
  Unobserved(const Unobserved&) = delete;
  Unobserved& operator=(const Unobserved&) = delete;
};

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "CUDA emulation: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

#ifdef SC_EMU_FIBERS
// Saves the callee-saved registers on this stack, stores its pointer in *from, and continues on
// the stack `to` (saved the same way). Not ucontext's swapcontext: it also saves the signal mask,
// a system call at every switch, which cost more than the kernels themselves.
extern "C" inline __attribute__((naked)) void sc_emu_switch(void** /*from*/, void* /*to*/) {
  asm("pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
      "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
      "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n ret");
}

// A block's threads as fibers on the launching OS thread, resumed round-robin: a thread runs
// until it waits at a barrier (yield) or ends. Fiber t plays thread t of every block. The
// thread_local built-ins are the OS thread's, so a fiber keeps its own threadIdx across a switch.
class Fibers {
 public:
  static Fibers& instance() {
    thread_local Fibers fibers;
    return fibers;
  }

  void run(unsigned count, const std::function<void(unsigned)>& body) {
    while (lanes_.size() < count) lanes_.push_back(std::make_unique<Lane>());
    body_ = &body;
    for (unsigned t = 0; t < count; ++t) lanes_[t]->done = false;
    for (unsigned left = count; left > 0;)
      for (unsigned t = 0; t < count; ++t)
        if (!lanes_[t]->done) {
          current_ = t;
          sc_emu_switch(&scheduler_, lanes_[t]->sp);
          left -= lanes_[t]->done;
        }
  }

  // From a fiber: let the others run; back here with this fiber's threadIdx.
  void yield() {
    const uint3 mine = threadIdx;
    sc_emu_switch(&lanes_[current_]->sp, scheduler_);
    threadIdx = mine;
  }

 private:
  // A fiber's stack starts as if sc_emu_switch had saved it: six registers, then `start` as the
  // return address, at a 16-byte boundary so that `start` begins with the ABI's alignment.
  struct Lane {
    Lane() {
      auto top = reinterpret_cast<uintptr_t>(stack.get() + kStack) & ~uintptr_t(15);
      void** frame = reinterpret_cast<void**>(top) - 2;
      frame[0] = reinterpret_cast<void*>(&Fibers::start);
      frame[1] = nullptr;  // no caller
      sp = frame - 6;
      std::fill(frame - 6, frame, nullptr);
    }
    static constexpr size_t kStack = 1 << 17;
    std::unique_ptr<char[]> stack{new char[kStack]};  // not zeroed: pages stay untouched until used
    void* sp = nullptr;
    bool done = true;
  };

  [[noreturn]] static void start() {
    Fibers& self = instance();
    for (;;) {
      const unsigned t = self.current_;
      (*self.body_)(t);
      self.lanes_[t]->done = true;
      sc_emu_switch(&self.lanes_[t]->sp, self.scheduler_);
    }
  }

  std::vector<std::unique_ptr<Lane>> lanes_;
  const std::function<void(unsigned)>* body_ = nullptr;
  void* scheduler_ = nullptr;
  unsigned current_ = 0;
};
using Executor = Fibers;
#endif

// A reusable barrier for a fixed group of threads that also enforces the CUDA rules a GPU would
// not forgive: every member waits at the same call site, and no member exits while others wait
// for it. Arrivals and exits are counted in one atomic word, so a phase completes either by the
// last arrival or by an exit, and both cases with a member gone are reported instead of hanging.
// Acquire/release atomics: ThreadSanitizer sees exactly the happens-before a barrier gives.
// Waiters sleep on the phase (futex): 2 cores run up to 1024 threads.
class Barrier {
 public:
  explicit Barrier(unsigned count) : count_(count), sites_(count) {}

  void arrive_and_wait(unsigned member, const char* what, const std::source_location& where) {
    sites_[member] = where;  // read by whoever completes the phase
    const unsigned phase = phase_.load(std::memory_order_relaxed);
    const unsigned before = counts_.fetch_add(1, std::memory_order_acq_rel);
    if ((before & 0xffff) + 1 + (before >> 16) == count_) {  // the last: it has acquired every arrival
      if (before >> 16) fail_at(what, where, where, "a thread of the group exited and will never arrive");
      for (const std::source_location& site : sites_)
        if (site.line() != where.line() || std::strcmp(site.file_name(), where.file_name()) != 0)
          fail_at(what, where, site, "threads wait at different call sites (divergent barrier)");
      counts_.store(0, std::memory_order_relaxed);  // every member is waiting: nobody else writes it
      phase_.store(phase + 1, std::memory_order_release);
      phase_.notify_all();
      return;
    }
    while (phase_.load(std::memory_order_acquire) == phase) {
#ifdef SC_EMU_FIBERS
      Fibers::instance().yield();
#else
      phase_.wait(phase, std::memory_order_relaxed);
#endif
    }
  }

  void exit_thread() {
    const unsigned before = counts_.fetch_add(1u << 16, std::memory_order_acq_rel);
    if (before & 0xffff)
      fail("a thread exited while others of its block or warp wait at a barrier (divergent barrier)");
  }

 private:
  [[noreturn]] static void fail_at(const char* what, const std::source_location& a, const std::source_location& b,
                                   const char* why) {
    char message[1024];
    std::snprintf(message, sizeof message, "%s at %s:%u (and %s:%u): %s", what, a.file_name(), unsigned(a.line()),
                  b.file_name(), unsigned(b.line()), why);
    fail(message);
  }

  const unsigned count_;                     // at most 1024
  std::vector<std::source_location> sites_;  // each member's latest call site
  std::atomic<unsigned> counts_{0};          // arrivals in this phase | exits << 16
  std::atomic<unsigned> phase_{0};
};

// What the threads of the running block share besides their `__shared__` variables.
struct Block {
  explicit Block(unsigned threads) : barrier(threads), votes(threads) {
    for (unsigned first = 0; first < threads; first += 32) warps.emplace_back(std::min(32u, threads - first));
  }
  Barrier barrier;
  std::deque<Barrier> warps;  // (a deque: a Barrier cannot move)
  std::vector<unsigned char> votes;
};
inline thread_local Block* block = nullptr;

inline unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// OS threads created once and reused (creating 256 threads per block costs more than the
// kernels): worker t plays thread t of every block. Semaphores (atomics) order the host's
// writes before a block and the block's writes before the host continues, as a launch would.
class Workers {
 public:
  static Workers& instance() {
    static Workers workers;
    return workers;
  }

  void run(unsigned count, const std::function<void(unsigned)>& body) {
    while (workers_.size() < count) {
      Worker& w = workers_.emplace_back();
      w.thread = std::thread([this, &w, t = unsigned(workers_.size() - 1)] { loop(w, t); });
    }
    body_ = &body;
    remaining_.store(count, std::memory_order_relaxed);
    for (unsigned t = 0; t < count; ++t) workers_[t].go.release();
    done_.acquire();
  }

  ~Workers() {
    stop_ = true;
    for (Worker& w : workers_) w.go.release();
    for (Worker& w : workers_) w.thread.join();
  }

 private:
  struct Worker {
    std::thread thread;
    std::binary_semaphore go{0};
  };

  void loop(Worker& w, unsigned t) {
    for (;;) {
      w.go.acquire();
      if (stop_) return;
      (*body_)(t);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.release();
    }
  }

  std::deque<Worker> workers_;
  const std::function<void(unsigned)>* body_ = nullptr;
  std::atomic<unsigned> remaining_{0};
  std::binary_semaphore done_{0};
  bool stop_ = false;
};

#ifndef SC_EMU_FIBERS
using Executor = Workers;
#endif

inline bool valid(const dim3& grid, const dim3& threads) {
  const uint64_t per_block = uint64_t(threads.x) * threads.y * threads.z;
  return grid.x >= 1 && grid.x <= 0x7fffffffu && grid.y >= 1 && grid.y <= 65535 && grid.z >= 1 && grid.z <= 65535 &&
         threads.x >= 1 && threads.x <= 1024 && threads.y >= 1 && threads.y <= 1024 && threads.z >= 1 &&
         threads.z <= 64 && per_block <= 1024;
}

template <typename... Params>
class Launch {
 public:
  Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 threads, size_t shared)
      : kernel_(kernel), grid_(grid), threads_(threads) {
    if (shared != 0) {
      std::fprintf(stderr, "CUDA emulation: %s: dynamic shared memory is not emulated\n", name);
      std::abort();
    }
  }

  // Arguments convert to the kernel's parameter types here, like at a CUDA launch; each
  // emulated thread then gets its own copy (kernel parameters are per thread).
  void operator()(Params... args) const {
    if (!valid(grid_, threads_)) {  // like CUDA: nothing runs, cudaGetLastError reports it
      last_error = cudaErrorInvalidConfiguration;
      return;
    }
    launches.fetch_add(1, std::memory_order_relaxed);
    const unsigned count = threads_.x * threads_.y * threads_.z;
    for (unsigned bz = 0; bz < grid_.z; ++bz)
      for (unsigned by = 0; by < grid_.y; ++by)
        for (unsigned bx = 0; bx < grid_.x; ++bx) {  // blocks one after another
          Block shared(count);
          Executor::instance().run(count, [&](unsigned t) {
            blockIdx = uint3{bx, by, bz};
            blockDim = threads_;
            gridDim = grid_;
            threadIdx = uint3{t % threads_.x, t / threads_.x % threads_.y, t / (threads_.x * threads_.y)};
            block = &shared;
            kernel_(args...);
            shared.warps[t / 32].exit_thread();
            shared.barrier.exit_thread();
            block = nullptr;
          });
        }
  }

 private:
  void (*kernel_)(Params...);
  dim3 grid_, threads_;
};

template <typename... Params>
Launch<Params...> launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 threads, size_t shared = 0,
                         cudaStream_t = nullptr) {
  return Launch<Params...>(name, kernel, grid, threads, shared);
}

}  // namespace sc_emu

inline void __syncthreads(const std::source_location& where = std::source_location::current()) {
  sc_emu::block->barrier.arrive_and_wait(sc_emu::linear_thread(), "__syncthreads", where);
}

// Full-warp ballots only (the kernels use 0xffffffff): each lane votes, the warp waits, every
// lane reads all votes, and the warp waits again so no lane votes anew before all have read.
// A vote is no memory fence on a GPU, so ThreadSanitizer must not see one here: a lane reading
// another lane's shared-memory write after a ballot, without __syncthreads, is a race.
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              const std::source_location& where = std::source_location::current()) {
  const sc_emu::Unobserved unobserved;
  sc_emu::Block& b = *sc_emu::block;
  const unsigned t = sc_emu::linear_thread(), first = t / 32 * 32;
  const unsigned lanes = std::min(32u, unsigned(b.votes.size()) - first);
  const unsigned active = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  if (mask != active)
    sc_emu::fail("__ballot_sync: the mask must name exactly the warp's lanes (full-warp ballots only)");
  sc_emu::Barrier& warp = b.warps[t / 32];
  b.votes[t] = predicate != 0;
  warp.arrive_and_wait(t % 32, "__ballot_sync", where);
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < lanes; ++lane) ballot |= unsigned(b.votes[first + lane]) << lane;
  warp.arrive_and_wait(t % 32, "__ballot_sync", where);
  return ballot;
}

inline int __popc(unsigned int x) { return std::popcount(x); }
// No __float_as_uint / __uint_as_float: common.h calls them only under __CUDA_ARCH__, which
// stays undefined here (defining it for the .cu objects alone would give common.h's inline
// functions two bodies in one program); its host branch gives the same bits.

// CUDA's atomicAdd overloads that the kernels use; a real atomic read-modify-write.
inline int atomicAdd(int* address, int value) { return std::atomic_ref<int>(*address).fetch_add(value); }
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}
