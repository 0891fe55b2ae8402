// The XLA custom call our collectives lower to: its target name and the
// attributes that carry the op's parameters from a lowering (TensorFlow's:
// cc_ops/tf/xla_collective_kernels.cc; JAX's: an ffi_call with the same
// attributes) to the handler that runs it in the engine (collective_handler.cc).
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace smdist {
namespace xla_call {

// One target for every platform: a handler each for XLA's "Host" and "CUDA" platforms.
constexpr char kTarget[] = "smdist_collective";

// Attribute names (see CallParameters).
constexpr char kType[] = "type";                    // CollectiveType
constexpr char kName[] = "name";                    // the collective's name, as the TF kernel would use
constexpr char kProcessSetId[] = "process_set_id";  // 0: all ranks
constexpr char kReduceOp[] = "reduce_op";           // ReduceOp (allreduce, reducescatter)
constexpr char kPrescale[] = "prescale";            // f64
constexpr char kPostscale[] = "postscale";          // f64
constexpr char kCompression[] = "compression";      // WireCompression (allreduce)
constexpr char kRootRank[] = "root_rank";           // broadcast: a world rank

// What a call carries besides its buffers. Every call carries all of it.
struct CallParameters {
  int64_t type = 0;  // CollectiveType
  std::string name;
  int64_t process_set_id = 0;
  int64_t reduce_op = 0;  // ReduceOp: allreduce, reducescatter
  double prescale = 1.0;
  double postscale = 1.0;
  int64_t compression = 0;  // WireCompression: allreduce
  int64_t root_rank = 0;    // broadcast
};

namespace internal {

inline std::string IntText(int64_t value) { return std::to_string(value) + " : i64"; }

// As the bits of the double, so the handler sees exactly this value.
inline std::string FloatText(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  char hex[24];
  std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(bits));
  return std::string(hex) + " : f64";
}

// Every byte but letters, digits and a few safe marks as a \XX escape, so no
// name can end the string or the dictionary early.
inline std::string StringText(const std::string& value) {
  std::string quoted = "\"";
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '/' || c == '-' || c == ':') {
      quoted += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof(escaped), "\\%02X", c);
      quoted += escaped;
    }
  }
  return quoted + "\"";
}

}  // namespace internal

// The custom call's backend config: the text of an MLIR dictionary attribute,
// which is how typed FFI calls receive their attributes.
inline std::string BackendConfig(const CallParameters& p) {
  using namespace internal;
  return std::string("{") + kType + " = " + IntText(p.type) + ", " + kName + " = " + StringText(p.name) + ", " +
         kProcessSetId + " = " + IntText(p.process_set_id) + ", " + kReduceOp + " = " + IntText(p.reduce_op) +
         ", " + kPrescale + " = " + FloatText(p.prescale) + ", " + kPostscale + " = " + FloatText(p.postscale) +
         ", " + kCompression + " = " + IntText(p.compression) + ", " + kRootRank + " = " + IntText(p.root_rank) +
         "}";
}

}  // namespace xla_call
}  // namespace smdist
