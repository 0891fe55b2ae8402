#include "xla_late_compilation_kernels.h"

#include <algorithm>
#include <string>

#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/logging.h"

namespace smdist {
namespace {

bool HasKernel(const std::string& op, absl::string_view device) {
  const tensorflow::KernelList kernels = tensorflow::GetRegisteredKernelsForOp(op);
  return std::any_of(kernels.kernel().begin(), kernels.kernel().end(),
                     [&](const tensorflow::KernelDef& k) { return k.device_type() == device; });
}

// The types a backend compiles: what its REGISTER_XLA_BACKEND line in TensorFlow passes.
absl::Span<const tensorflow::DataType> BackendTypes(absl::string_view device) {
  if (device == tensorflow::DEVICE_GPU_XLA_JIT) return tensorflow::kGpuAllTypes;
  return tensorflow::kCpuAllTypes;
}

// The KernelDef RegisterCompilationKernels() builds: each type attribute takes
// the backend's types that the OpDef allows, plus string (AllowStringType). No
// host-memory args: TensorFlow sets none for compile-time constant inputs
// either. Its backend op filters touch only TensorFlow's own ops.
tensorflow::KernelDef CompilationKernelDef(const tensorflow::OpDef& op_def, absl::string_view device) {
  tensorflow::KernelDef kdef;
  kdef.set_op(op_def.name());
  kdef.set_device_type(std::string(device));
  for (const tensorflow::OpDef::AttrDef& attr : op_def.attr()) {
    if (attr.type() != "type" && attr.type() != "list(type)") continue;
    tensorflow::KernelDef::AttrConstraint* constraint = kdef.add_constraint();
    constraint->set_name(attr.name());
    auto* allowed = constraint->mutable_allowed_values()->mutable_list();
    const auto& op_types = attr.allowed_values().list().type();
    for (tensorflow::DataType type : BackendTypes(device)) {
      if (!attr.has_allowed_values() || std::find(op_types.begin(), op_types.end(), type) != op_types.end()) {
        allowed->add_type(type);
      }
    }
    allowed->add_type(tensorflow::DT_STRING);
  }
  return kdef;
}

}  // namespace

void EnsureCompilationKernels(std::initializer_list<LateXlaOp> ops, absl::Span<const absl::string_view> devices) {
  // Idempotent in TensorFlow (a flag under its registry's lock): returns at
  // once if it already ran; after it, it never runs again, so what we add
  // below cannot be added twice.
  tensorflow::XlaOpRegistry::RegisterCompilationKernels();
  for (const LateXlaOp& late : ops) {
    const tensorflow::OpDef* op_def = nullptr;
    TF_CHECK_OK(tensorflow::OpRegistry::Global()->LookUpOpDef(late.op, &op_def));
    for (absl::string_view device : devices) {
      if (!tensorflow::XlaOpRegistry::IsBackendRegistered(std::string(device)) || HasKernel(late.op, device)) continue;
      // Lives as long as the process, as TensorFlow's own registrars do.
      new tensorflow::kernel_factory::OpKernelRegistrar(new tensorflow::KernelDef(CompilationKernelDef(*op_def, device)),
                                                        "XlaJitOp", late.factory);
    }
  }
}

}  // namespace smdist
