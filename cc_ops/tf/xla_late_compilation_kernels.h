// Compilation kernels for XLA lowerings registered after TensorFlow set up XLA.
//
// REGISTER_XLA_OP only records a lowering; TensorFlow turns the records into
// XLA_CPU_JIT / XLA_GPU_JIT kernels once, in
// XlaOpRegistry::RegisterCompilationKernels(), which it calls when its first
// eager op, tf.data pipeline or Keras model sets up the devices. An op library
// loaded after that (tf.load_op_library, i.e. `sd.init()` after any TensorFlow
// work) gets no kernels, and jit_compile then fails with "No registered ...
// OpKernel for XLA_CPU_JIT devices".
#ifndef SMDIST_CC_OPS_TF_XLA_LATE_COMPILATION_KERNELS_H_
#define SMDIST_CC_OPS_TF_XLA_LATE_COMPILATION_KERNELS_H_

#include <initializer_list>

#include "tensorflow/compiler/tf2xla/xla_op_registry.h"  // also absl::Span

namespace smdist {

// One lowering registered with REGISTER_XLA_OP(...AllowStringType()...).
struct LateXlaOp {
  const char* op;
  tensorflow::XlaOpRegistry::Factory factory;
};

// Call after the REGISTER_XLA_OPs of `ops` ran. Runs TensorFlow's
// RegisterCompilationKernels() if it has not run (it then makes our kernels
// itself); if it had run before, registers for each op and device the kernel
// it would have made. Never registers a kernel twice.
void EnsureCompilationKernels(std::initializer_list<LateXlaOp> ops, absl::Span<const absl::string_view> devices);

}  // namespace smdist

#endif  // SMDIST_CC_OPS_TF_XLA_LATE_COMPILATION_KERNELS_H_
