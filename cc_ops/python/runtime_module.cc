// pybind11 bindings for engine lifetime, topology and build facts. Data passes
// through here only in hooks: _copy_bytes (tests and benchmarks/copy_alias.py),
// the buffer collectives (buffer_collectives.cc: tests without TensorFlow) and
// the device collectives (device_collectives.cc: GPU tests and benchmarks on
// CuPy); users' collectives go through the TensorFlow ops.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "buffer_collectives.h"
#include "device_collectives.h"
#include "common/build_info.h"
#include "common/copy_bytes.h"
#include "engine.h"
#include "status_errors.h"

namespace py = pybind11;

namespace {

using smdist_python::RaiseIfError;

const smdist::Topology RequireTopology() {
  auto& engine = smdist::Engine::Instance();
  if (!engine.initialized()) {
    throw py::value_error(
        "smdist_tf has not been initialized: call smdist_tf.init() first");
  }
  return engine.topology();
}

}  // namespace

PYBIND11_MODULE(_runtime, m) {
  m.doc() = "smdist_tf engine runtime (lifetime, topology, build information)";
  m.def("init", [] {
    py::gil_scoped_release release;  // init is collective; let other threads run
    RaiseIfError(smdist::Engine::Instance().Init());
  });
  m.def("shutdown", [] {
    py::gil_scoped_release release;
    RaiseIfError(smdist::Engine::Instance().Shutdown());
  });
  // Process sets: add/remove are collective over every rank (engine.h).
  m.def("add_process_set", [](std::vector<int> ranks) {
    int32_t id = 0;
    py::gil_scoped_release release;
    RaiseIfError(smdist::Engine::Instance().AddProcessSet(std::move(ranks), &id));
    return id;
  });
  m.def("remove_process_set", [](int32_t id) {
    py::gil_scoped_release release;
    RaiseIfError(smdist::Engine::Instance().RemoveProcessSet(id));
  });
  m.def("process_set_ids", [] { return smdist::Engine::Instance().ProcessSetIds(); });
  // (ranks, this rank's index among them or -1) of a registered set.
  m.def("process_set_membership", [](int32_t id) {
    smdist::ProcessSetMembership set;
    RaiseIfError(smdist::Engine::Instance().Membership(id, &set));
    return py::make_tuple(set.ranks, set.rank);
  });
  m.def("failed_peer", [] { return smdist::Engine::Instance().failed_peer(); });
  m.def("owns_mpi", [] { return smdist::Engine::Instance().owns_runtime(); });
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    RaiseIfError(smdist::Engine::Instance().StartTimeline(path, mark_cycles));
  });
  m.def("stop_timeline", [] { smdist::Engine::Instance().StopTimeline(); });
  // What init() would refuse in this process's environment, or "": smdistrun checks the ranks'
  // settings with the engine's own parser before it starts them (no MPI, no engine started).
  m.def("environment_config_error", [] {
    smdist::EngineConfig config;
    const smdist::Status s = smdist::EngineConfig::FromEnvironment(&config);
    return s.ok() ? std::string() : s.message();
  });
  m.def("is_initialized", [] { return smdist::Engine::Instance().initialized(); });
  m.def("rank", [] { return RequireTopology().rank; });
  m.def("size", [] { return RequireTopology().size; });
  m.def("local_rank", [] { return RequireTopology().local_rank; });
  m.def("local_size", [] { return RequireTopology().local_size; });
  m.def("cross_rank", [] { return RequireTopology().cross_rank; });
  m.def("cross_size", [] { return RequireTopology().cross_size; });
  m.def("is_homogeneous", [] { return RequireTopology().is_homogeneous; });
  m.def("mpi_threads_supported", [] {
    RequireTopology();
    return smdist::Engine::Instance().runtime_threads_multiple();
  });
  m.def("mpi_built", [] { return smdist::kMpiBuilt; });
  m.def("nccl_built", [] { return smdist::NcclVersionLoadable(); });
  m.def("cuda_built", [] { return smdist::CudaRuntimeLoadable(); });
  m.def("config", [] {
    RequireTopology();
    const smdist::EngineConfig c = smdist::Engine::Instance().config();
    py::dict d;
    d["fusion_threshold_bytes"] = c.fusion_threshold_bytes;
    d["cycle_time_ms"] = c.cycle_time_ms;
    d["stall_check_seconds"] = c.stall_check_seconds;
    d["stall_shutdown_seconds"] = c.stall_shutdown_seconds;
    d["hostname"] = c.hostname;
    d["hierarchical_allreduce"] = c.hierarchical_allreduce;
    d["shm_segment_bytes"] = c.shm_segment_bytes;
    d["shm_min_bytes"] = c.shm_min_bytes;
    d["cross_memory_min_bytes"] = c.cross_memory_min_bytes;
    d["cross_memory_min_measured"] = c.cross_memory_min_measured;
    d["cross_memory_attach"] = c.cross_memory_attach;
    d["shared_output_bytes"] = c.shared_output_bytes;
    d["cache_capacity"] = c.cache_capacity;
    d["timeline"] = c.timeline_path;
    d["timeline_mark_cycles"] = c.timeline_mark_cycles;
    d["timeline_sample_every"] = c.timeline_sample_every;
    d["log_level"] = smdist::LogLevelName(c.log_level);
    d["gpu_operations"] = c.gpu_operations_nccl ? "NCCL" : "MPI";
    d["gpu_hierarchical_allreduce"] = c.gpu_hierarchical_allreduce;
    d["autotune"] = c.autotune;
    d["autotune_finished"] = c.autotune_finished;
    // What the transport actually chose (the settings above are only wishes).
    d["intra_host_allreduce"] = smdist::Engine::Instance().intra_host_allreduce();
    d["negotiation_busy_poll_us"] = smdist::Engine::Instance().negotiation_busy_poll_us();
    return d;
  });
  // Bytes of this rank's shared output arena that tensors hold now (tests).
  // What a rank exiting with an error does before it goes (tests).
  m.def("_announce_failure", [](const std::string& failure) {
    py::gil_scoped_release release;
    smdist::Engine::Instance().AnnounceFailure(failure, 5.0);
  });
  m.def("_cached_names", [] {
    py::gil_scoped_release release;  // waits for a running cycle
    std::vector<std::string> names;
    RaiseIfError(smdist::Engine::Instance().CachedNames(&names));
    return names;
  });
  m.def("_cycles_run", [] {
    uint64_t cycles = 0;
    RaiseIfError(smdist::Engine::Instance().CyclesRun(&cycles));
    return cycles;
  });
  m.def("_allreduce_plan", [](const std::vector<int64_t>& counts, const std::string& dtype,
                              const std::string& compression, double prescale) {
    // Names as DataTypeName / WireCompressionName spell them ("float32", "none").
    int32_t data_type = -1, wire = -1;
    for (int32_t d = 0; d <= static_cast<int32_t>(smdist::DataType::kInt16); ++d) {
      if (dtype == smdist::DataTypeName(static_cast<smdist::DataType>(d))) data_type = d;
    }
    for (int32_t c = 0; c <= static_cast<int32_t>(smdist::WireCompression::kInt8); ++c) {
      if (compression == smdist::WireCompressionName(static_cast<smdist::WireCompression>(c))) wire = c;
    }
    if (data_type < 0 || wire < 0) throw py::value_error("unknown dtype or compression: " + dtype + ", " + compression);
    py::gil_scoped_release release;  // waits for a running cycle
    return smdist::Engine::Instance().DescribeAllreducePlan(counts, static_cast<smdist::DataType>(data_type),
                                                            static_cast<smdist::WireCompression>(wire), prescale);
  });
  smdist_python::DefineBufferCollectives(m);
  smdist_python::DefineDeviceCollectives(m);
  m.def("_shared_output_bytes_in_use", [] { return smdist::Engine::Instance().shared_output_bytes_in_use(); });
  // The engine's bulk copy, exposed so it can be tested and timed at chosen offsets.
  // vector_loop=True takes the slow-case loop whatever the CPU, so tests cover it everywhere.
  m.def("_copy_bytes", [](py::buffer dst, size_t dst_offset, py::buffer src, size_t src_offset, size_t bytes,
                          bool vector_loop) {
    const py::buffer_info to = dst.request(/*writable=*/true);
    const py::buffer_info from = src.request();
    const auto length = [](const py::buffer_info& b) { return static_cast<size_t>(b.size * b.itemsize); };
    for (const py::buffer_info* b : {&to, &from}) {
      if (b->ndim != 1 || b->strides[0] != b->itemsize) {
        throw py::value_error("_copy_bytes: needs flat contiguous buffers");
      }
    }
    if (dst_offset + bytes > length(to) || src_offset + bytes > length(from)) {
      throw py::value_error("_copy_bytes: range outside a buffer");
    }
    const auto* s = static_cast<const uint8_t*>(from.ptr) + src_offset;
    auto* d = static_cast<uint8_t*>(to.ptr) + dst_offset;
    if (s < d + bytes && d < s + bytes) throw py::value_error("_copy_bytes: ranges overlap");
    py::gil_scoped_release release;
    if (vector_loop) {
      smdist::CopyBytesVectorLoop(d, s, bytes);
    } else {
      smdist::CopyBytes(d, s, bytes);
    }
  }, py::arg("dst"), py::arg("dst_offset"), py::arg("src"), py::arg("src_offset"), py::arg("bytes"),
     py::arg("vector_loop") = false);
  m.def("_cpu_has_slow_movsb_window", &smdist::CpuHasSlowMovsbWindow);
}
