#include "common/shared_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

namespace smdist {

Status SharedLibrary::Open(const char* path_variable, const std::vector<std::string>& sonames,
                           SharedLibrary* out) {
  const char* forced = std::getenv(path_variable);
  if (forced != nullptr && *forced != '\0') {
    void* h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      return Status::PreconditionFailed(std::string(path_variable) + "=" + forced + " cannot be loaded: " + dlerror());
    }
    *out = SharedLibrary();
    out->handle_ = h;
    out->path_ = forced;
    return Status::OK();
  }
  // A copy already in the process first: two copies of the CUDA runtime in one
  // process work, but a framework's own is the one its streams belong to.
  for (int mode : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const std::string& name : sonames) {
      void* h = dlopen(name.c_str(), mode);
      if (h != nullptr) {
        *out = SharedLibrary();
        out->handle_ = h;
        out->path_ = name;
        return Status::OK();
      }
    }
  }
  std::string tried;
  for (const std::string& name : sonames) tried += (tried.empty() ? "" : ", ") + name;
  return Status::PreconditionFailed("none of " + tried + " could be loaded (set " + path_variable +
                                    " to the library's path, or add its folder to LD_LIBRARY_PATH)");
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

SharedLibrary::SharedLibrary(SharedLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), path_(std::move(other.path_)) {}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

Status SharedLibrary::Symbol(const char* name, void** out) const {
  dlerror();
  *out = dlsym(handle_, name);
  if (*out == nullptr) return Status::PreconditionFailed(path_ + " has no symbol " + name);
  return Status::OK();
}

}  // namespace smdist
