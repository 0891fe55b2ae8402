#include "common/cuda_runtime.h"

#include <memory>
#include <mutex>

namespace smdist {
namespace {
constexpr int kCudaSuccess = 0;
constexpr int kCudaMemcpyDefault = 4;  // direction from the pointers (unified addressing)
}  // namespace

const CudaRuntime* CudaRuntime::Get(Status* why) {
  static std::once_flag once;
  // Never freed: device buffers and communicators released at process exit,
  // after static destructors ran, still call into the library.
  static CudaRuntime* runtime = nullptr;
  static Status load_status;
  std::call_once(once, [] {
    auto r = std::make_unique<CudaRuntime>();
    load_status = r->Load();
    if (load_status.ok()) runtime = r.release();
  });
  if (runtime == nullptr && why != nullptr) *why = load_status;
  return runtime;
}

Status CudaRuntime::Load() {
  SMDIST_RETURN_IF_ERROR(SharedLibrary::Open("SMDIST_CUDA_RUNTIME_LIBRARY",
                                             {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}, &library_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaSetDevice", &set_device_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaGetDeviceCount", &get_device_count_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaDeviceGetPCIBusId", &device_get_pci_bus_id_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaMalloc", &malloc_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaFree", &free_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaMallocHost", &malloc_host_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaFreeHost", &free_host_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaMemcpyAsync", &memcpy_async_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaStreamSynchronize", &stream_synchronize_));
  SMDIST_RETURN_IF_ERROR(library_.Function("cudaGetErrorString", &get_error_string_));
  return Status::OK();
}

Status CudaRuntime::Check(int error, const char* call) const {
  if (error == kCudaSuccess) return Status::OK();
  return Status::Unknown(std::string(call) + " failed: " + get_error_string_(error) + " (CUDA error " +
                         std::to_string(error) + ")");
}

Status CudaRuntime::SetDevice(int device) const { return Check(set_device_(device), "cudaSetDevice"); }

Status CudaRuntime::DeviceCount(int* count) const {
  return Check(get_device_count_(count), "cudaGetDeviceCount");
}

Status CudaRuntime::PciBusId(int device, std::string* out) const {
  char id[64] = {0};
  SMDIST_RETURN_IF_ERROR(Check(device_get_pci_bus_id_(id, sizeof(id) - 1, device), "cudaDeviceGetPCIBusId"));
  *out = id;
  return Status::OK();
}

Status CudaRuntime::Malloc(void** ptr, size_t bytes) const { return Check(malloc_(ptr, bytes), "cudaMalloc"); }

void CudaRuntime::Free(void* ptr) const { free_(ptr); }

Status CudaRuntime::MallocHost(void** ptr, size_t bytes) const {
  return Check(malloc_host_(ptr, bytes), "cudaMallocHost");
}

void CudaRuntime::FreeHost(void* ptr) const { free_host_(ptr); }

Status CudaRuntime::CopyAsync(void* dst, const void* src, size_t bytes, void* stream) const {
  if (bytes == 0) return Status::OK();
  return Check(memcpy_async_(dst, src, bytes, kCudaMemcpyDefault, stream), "cudaMemcpyAsync");
}

Status CudaRuntime::Synchronize(void* stream) const {
  return Check(stream_synchronize_(stream), "cudaStreamSynchronize");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cuda_->Free(data_);
}

Status DeviceBuffer::Reserve(const CudaRuntime* cuda, int device, size_t bytes) {
  if (data_ != nullptr && bytes <= bytes_) return Status::OK();
  if (data_ != nullptr) cuda_->Free(data_);
  data_ = nullptr;
  bytes_ = 0;
  cuda_ = cuda;
  SMDIST_RETURN_IF_ERROR(cuda->SetDevice(device));
  SMDIST_RETURN_IF_ERROR(cuda->Malloc(&data_, bytes));
  bytes_ = bytes;
  return Status::OK();
}

}  // namespace smdist
