// The thread count of the CPU kernels' OpenMP parallel regions. GCC's libgomp keeps a thread pool
// that does not survive fork(): a child that runs a parallel region after its parent ran one (a
// multiprocessing 'fork' worker, a data-loader worker) waits forever for the parent's threads.
// There the kernels run on the calling thread alone (a region of one thread does not use the pool).
#pragma once
#include <omp.h>
#include <pthread.h>

#include <atomic>

namespace fm3::cpu {

namespace threads_detail {
inline std::atomic<bool> used{false};              // this process has run a parallel region
inline std::atomic<bool> forked_after_use{false};  // ... and is a child forked after that
inline void on_fork_child() {
  if (used.load()) forked_after_use.store(true);
}
inline const int atfork_registered = pthread_atfork(nullptr, nullptr, on_fork_child);
}  // namespace threads_detail

// num_threads of each of the kernels' parallel regions: OpenMP's, or 1 in a child forked after use.
inline int parallel_threads() {
  if (threads_detail::forked_after_use.load(std::memory_order_relaxed)) return 1;
  threads_detail::used.store(true, std::memory_order_relaxed);
  return omp_get_max_threads();
}

}  // namespace fm3::cpu
