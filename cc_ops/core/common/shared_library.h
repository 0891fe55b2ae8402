// A library opened at run time (dlopen), so one build of the engine serves
// machines with and without it: the GPU libraries (CUDA runtime, NCCL) are
// looked for when first needed, never linked.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace smdist {

class SharedLibrary {
 public:
  // Opens the first of: the file named by environment variable `path_variable`
  // (when set: only that one), a library of `sonames` this process has already
  // loaded (a framework's own copy), then `sonames` on the loader's search path.
  static Status Open(const char* path_variable, const std::vector<std::string>& sonames, SharedLibrary* out);

  SharedLibrary() = default;
  ~SharedLibrary();
  SharedLibrary(SharedLibrary&& other) noexcept;
  SharedLibrary& operator=(SharedLibrary&& other) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // Looks `name` up; an error names the library and the symbol.
  Status Symbol(const char* name, void** out) const;
  // Typed form of Symbol() for function pointers.
  template <typename F>
  Status Function(const char* name, F* out) const {
    void* p = nullptr;
    SMDIST_RETURN_IF_ERROR(Symbol(name, &p));
    *out = reinterpret_cast<F>(p);
    return Status::OK();
  }
  const std::string& path() const { return path_; }

 private:
  void* handle_ = nullptr;
  std::string path_;  // what was opened, for messages
};

}  // namespace smdist
