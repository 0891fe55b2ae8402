// Where a tensor lives, and when its data is ready there. Host tensors are
// ready when submitted; a GPU tensor becomes ready when the work queued before
// it on its stream has run, which its ReadyEvent reports.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace smdist {

struct Device {
  // -1: the host; otherwise the ordinal of a GPU visible to this process.
  int32_t id = -1;

  static Device Cpu() { return Device{}; }
  static Device Gpu(int32_t ordinal) { return Device{ordinal}; }
  bool is_cpu() const { return id < 0; }
  bool operator==(const Device& o) const { return id == o.id; }
  bool operator!=(const Device& o) const { return id != o.id; }
  std::string ToString() const { return is_cpu() ? "CPU" : "GPU:" + std::to_string(id); }
};

// Completion of the work a tensor waits on (a GPU stream event). The data
// plane waits for it before it reads the tensor.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  // Blocks until the data is ready, or returns why it never will be.
  virtual Status Wait() = 0;
};

}  // namespace smdist
