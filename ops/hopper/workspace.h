// The launchers' stream-ordered device workspace (workspace.cu): taken from the library's pool of
// the stream's device, given back to it on the stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace fm3::hopper {

cudaError_t workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream);
cudaError_t workspace_free(void* ptr, cudaStream_t stream);

}  // namespace fm3::hopper
