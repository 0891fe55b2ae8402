// The CUDA runtime, loaded when a GPU tensor first needs it (never linked):
// the handful of calls the engine makes itself - device selection, device
// memory, copies ordered on a stream. Streams are opaque pointers (the
// framework's cudaStream_t); nullptr is the default stream.
#pragma once

#include <cstddef>
#include <string>

#include "common/shared_library.h"
#include "common/status.h"

namespace smdist {

class CudaRuntime {
 public:
  // The process's runtime, loaded on first use (SMDIST_CUDA_RUNTIME_LIBRARY,
  // else a libcudart already loaded, else libcudart.so.13/.12 on the search
  // path); null with *why when there is none.
  static const CudaRuntime* Get(Status* why);

  // Makes `device` current on the calling thread (the engine's).
  Status SetDevice(int device) const;
  Status DeviceCount(int* count) const;
  // The device's PCI bus id ("0000:3b:00.0"): which physical GPU it is.
  Status PciBusId(int device, std::string* out) const;
  Status Malloc(void** ptr, size_t bytes) const;
  void Free(void* ptr) const;
  // Page-locked host memory: copies to and from it run at the bus's speed and
  // do not block the host, so it must outlive the copies queued on it.
  Status MallocHost(void** ptr, size_t bytes) const;
  void FreeHost(void* ptr) const;
  // Copies `bytes` between any two of host and device memory, in order on `stream`.
  Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) const;
  // Waits until everything queued on `stream` has run.
  Status Synchronize(void* stream) const;
  const std::string& library() const { return library_.path(); }

 private:
  Status Load();
  Status Check(int error, const char* call) const;

  SharedLibrary library_;
  int (*set_device_)(int) = nullptr;
  int (*get_device_count_)(int*) = nullptr;
  int (*device_get_pci_bus_id_)(char*, int, int) = nullptr;
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_)(void*) = nullptr;
  int (*malloc_host_)(void**, size_t) = nullptr;
  int (*free_host_)(void*) = nullptr;
  int (*memcpy_async_)(void*, const void*, size_t, int, void*) = nullptr;
  int (*stream_synchronize_)(void*) = nullptr;
  const char* (*get_error_string_)(int) = nullptr;
};

// Device memory that grows on demand and is freed with its owner (fusion
// buffers on a GPU).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` on `device`, whose runtime `cuda` is; keeps the contents
  // only while no growth is needed.
  Status Reserve(const CudaRuntime* cuda, int device, size_t bytes);
  void* data() const { return data_; }

 private:
  const CudaRuntime* cuda_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace smdist
