// The launchers' stream-ordered device workspace: a memory pool per device, owned by the library,
// that keeps the memory it took from the driver between calls (release threshold: never). The
// device's default pool (cudaMallocAsync) hands its free memory back at every synchronize, so each
// backward mapped its fp32 dQ accumulator again: ~1 ms per call at S=8K (BENCHMARKS.md).
#include "workspace.h"

#include <cstdint>
#include <mutex>

#include "fm3_cuda.h"
#include "launch_common.h"

namespace fm3::hopper {
namespace {

constexpr int kMaxDevices = 64;
std::mutex g_pools_mutex;
cudaMemPool_t g_pools[kMaxDevices] = {};

cudaError_t pool_of(int device, cudaMemPool_t* out) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  if (g_pools[device] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    cudaError_t e = cudaMemPoolCreate(&pool, &props);
    if (e != cudaSuccess) return e;
    uint64_t keep = UINT64_MAX;
    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) {
      cudaMemPoolDestroy(pool);
      return e;
    }
    g_pools[device] = pool;
  }
  *out = g_pools[device];
  return cudaSuccess;
}

}  // namespace

cudaError_t workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  int device = 0;
  cudaError_t e = cudaStreamGetDevice(stream, &device);
  if (e != cudaSuccess) return e;
  cudaMemPool_t pool = nullptr;
  e = pool_of(device, &pool);
  if (e != cudaSuccess) return e;
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

cudaError_t workspace_free(void* ptr, cudaStream_t stream) { return cudaFreeAsync(ptr, stream); }

}  // namespace fm3::hopper

extern "C" int fm3_cuda_release_workspace(char* err, size_t err_len) {
  using namespace fm3::hopper;
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  for (cudaMemPool_t pool : g_pools)
    if (pool != nullptr) FM3_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  return 0;
}
