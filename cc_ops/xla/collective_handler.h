// The handlers of the smdist_collective custom call (collective_call.h), as C
// symbols of libsmdist_xla.so, so every XLA runtime can register them:
// TensorFlow's through XLA_FFI_REGISTER_HANDLER (cc_ops/tf/xla_handler_registration.cc),
// JAX's through jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform=...).
// Framework-free: only XLA's FFI headers (TensorFlow's or jaxlib's, one C ABI)
// and the engine.
#pragma once

#include "xla/ffi/api/api.h"

// XLA's "Host" platform ("cpu" in JAX): host buffers. Returns a future that
// completes when the engine is done with every buffer, so XLA goes on with
// independent work meanwhile.
XLA_FFI_DECLARE_HANDLER_SYMBOL(smdist_xla_collective_host);

// XLA's "CUDA" platform: device buffers. Queues the work on XLA's stream (NCCL,
// or the host-staged path) and returns once it is queued; stream order does the
// rest, with no host synchronisation. Registered without the command-buffer
// trait, so XLA never captures it into a CUDA graph.
XLA_FFI_DECLARE_HANDLER_SYMBOL(smdist_xla_collective_cuda);
