#include "engine.h"

#include "collective_executor.h"
#include "coordinator.h"
#include "logging.h"
#include "mpi_transport.h"

namespace smdist {

Engine& Engine::Instance() {
  static Engine instance;
  return instance;
}

Engine::~Engine() {
  // Finalize() normally joined the thread; a process exiting without it must
  // not abort in std::thread's destructor.
  if (thread_.joinable()) thread_.detach();
}

Status Engine::Init() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (initialized_) return Status::OK();
  SMDIST_RETURN_IF_ERROR(EnsureMpiInitialized(&mpi_threads_multiple_));
  config_ = EngineConfig::FromEnvironment();
  std::unique_ptr<MpiTransport> mpi;
  SMDIST_RETURN_IF_ERROR(MpiTransport::Create(config_.hostname, &mpi));
  transport_ = std::move(mpi);
  SetLogRank(transport_->topology().rank);
  queue_ = std::make_unique<TensorQueue>();
  shutdown_requested_ = false;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    running_ = true;
    stop_reason_.clear();
  }
  thread_ = std::thread(&Engine::BackgroundLoop, this);
  initialized_ = true;
  return Status::OK();
}

Status Engine::Shutdown() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (!initialized_) return Status::OK();
  shutdown_requested_ = true;
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
  initialized_ = false;
  queue_.reset();
  transport_.reset();
  return Status::OK();
}

void Engine::Finalize() {
  Shutdown();
  FinalizeMpiIfOwned();
}

Topology Engine::topology() const {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  return transport_ ? transport_->topology() : Topology();
}

EngineConfig Engine::config() const {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  return config_;
}

Status Engine::Enqueue(std::vector<TensorEntry> entries) {
  std::lock_guard<std::mutex> state(state_mu_);
  if (!initialized_) {
    return Status::PreconditionFailed(
        "smdist_tf has not been initialized: call smdist_tf.init() before any collective");
  }
  if (!running_) return Status::Aborted(stop_reason_);
  return queue_->Add(std::move(entries), transport_->topology().rank);
}

void Engine::Stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> state(state_mu_);
    running_ = false;
    stop_reason_ = reason;
  }
  const Status aborted = Status::Aborted(reason);
  for (TensorEntry& e : queue_->TakeAll()) {
    if (e.done) e.done(aborted);
  }
}

void Engine::BackgroundLoop() {
  const Topology topo = transport_->topology();
  Coordinator coordinator(topo.size, config_.fusion_threshold_bytes,
                          StallInspector(config_.stall_check_seconds, config_.stall_shutdown_seconds));
  CollectiveExecutor executor(transport_.get());
  while (RunCycle(&coordinator, &executor)) {
  }
}

bool Engine::RunCycle(Coordinator* coordinator, CollectiveExecutor* executor) {
  const auto cycle_us = static_cast<int64_t>(config_.cycle_time_ms * 1000.0);
  queue_->WaitForWork(cycle_us);

  RequestList mine;
  queue_->PopRequests(&mine.requests);
  mine.shutdown = shutdown_requested_.load();

  std::vector<std::vector<uint8_t>> gathered;
  Status s = transport_->GatherToRoot(mine.Serialize(), &gathered);
  if (!s.ok()) {
    Stop("negotiation failed: " + s.message());
    return false;
  }
  std::vector<uint8_t> bytes;
  if (transport_->topology().rank == 0) {
    for (size_t r = 0; r < gathered.size(); ++r) {
      RequestList list;
      if (!RequestList::Parse(gathered[r].data(), gathered[r].size(), &list)) {
        LogError("malformed request list from rank " + std::to_string(r));
        continue;
      }
      coordinator->Add(list, static_cast<int>(r));
    }
    bytes = coordinator->BuildResponses().Serialize();
  }
  s = transport_->BroadcastFromRoot(&bytes);
  ResponseList responses;
  if (!s.ok() || !ResponseList::Parse(bytes.data(), bytes.size(), &responses)) {
    Stop("negotiation failed: " + (s.ok() ? std::string("malformed response list") : s.message()));
    return false;
  }

  for (const Response& response : responses.responses) {
    std::vector<TensorEntry> entries(response.names.size());
    for (size_t i = 0; i < response.names.size(); ++i) {
      if (!queue_->Take(response.names[i], &entries[i])) {
        Stop("internal error: negotiated collective '" + response.names[i] +
             "' is unknown on this rank");
        return false;
      }
    }
    s = executor->Execute(response, &entries);
    if (!s.ok()) {
      Stop("collective failed: " + s.message());
      return false;
    }
  }
  if (responses.shutdown) {
    if (responses.shutdown_error.rfind("stall", 0) == 0) LogError(responses.shutdown_error);
    Stop(responses.shutdown_error);
    return false;
  }
  return true;
}

}  // namespace smdist
