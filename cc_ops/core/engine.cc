#include "engine.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "collective_stream.h"
#include "common/logging.h"
#include "common/numbered_names.h"
#include "control/process_set_agreement.h"

namespace smdist {

Engine& Engine::Instance() {
  static Engine instance;
  return instance;
}

namespace {
// How long a failing rank waits for its peers to learn why it leaves, and
// then for them to report it before its exit makes the launcher stop them.
constexpr double kFailureAnnounceSeconds = 1.0;
constexpr auto kFailureReportGrace = std::chrono::milliseconds(300);

void OnProcessExit(int status, void*) { Engine::Instance().AtProcessExit(status); }
}  // namespace


Engine::~Engine() = default;  // a stream whose thread never ended detaches it

Status Engine::Init() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (initialized_) {
    {
      std::lock_guard<std::mutex> state(state_mu_);
      if (running_) return Status::OK();
    }
    // Stopped by another rank or a stall: clean up, then start afresh.
    ReleaseLocked();
  }
  // Settings first: a malformed variable fails before anything starts.
  EngineConfig config;
  SMDIST_RETURN_IF_ERROR(EngineConfig::FromEnvironment(&config));
  SetLogLevel(config.log_level);
  SMDIST_RETURN_IF_ERROR(StartCommunicationRuntime(&runtime_threads_multiple_));
  // After the runtime started: exit() runs handlers in reverse order, so ours
  // runs while it is still usable. on_exit (glibc), unlike atexit, is given
  // the exit status.
  static std::once_flag exit_handler;
  std::call_once(exit_handler, [] { on_exit(&OnProcessExit, nullptr); });
  config_ = config;
  std::unique_ptr<Transports> transports;
  SMDIST_RETURN_IF_ERROR(Transports::Create(config_, runtime_threads_multiple_, &transports));
  const Topology topo = transports->topology();
  if (!config_.timeline_path.empty()) {
    // While nothing else holds the transports, so a refused path fails init cleanly.
    SMDIST_RETURN_IF_ERROR(
        timeline_.Start(TimelinePathOfRank(config_.timeline_path, topo.rank, topo.size), topo.rank,
                        config_.timeline_mark_cycles, config_.timeline_sample_every));
  }
  config_.cross_memory_min_bytes = transports->cross_memory_min_bytes();
  config_.cross_memory_min_measured = transports->cross_memory_min_measured();
  {
    std::lock_guard<std::mutex> arena(arena_mu_);
    output_arena_ = transports->output_arena();
  }
  config_.shared_output_bytes = output_arena_ ? output_arena_->capacity() : 0;
  SetLogRank(topo.rank);
  if (LogEnabled(LogLevel::kInfo)) {
    LogInfo("engine started: rank " + std::to_string(topo.rank) + " of " + std::to_string(topo.size) + " on host " +
            config_.hostname + " (local rank " + std::to_string(topo.local_rank) + " of " +
            std::to_string(topo.local_size) + ", host " + std::to_string(topo.cross_rank) + " of " +
            std::to_string(topo.cross_size) + "); intra-host allreduce: " + transports->intra_host_allreduce() +
            "; fusion threshold " + std::to_string(config_.fusion_threshold_bytes) + " bytes, cycle time " +
            FormatNumber(config_.cycle_time_ms) + " ms, response cache " + std::to_string(config_.cache_capacity));
  }
  std::vector<int> all_ranks(topo.size);
  for (int r = 0; r < topo.size; ++r) all_ranks[r] = r;
  const Transports* world = transports.get();
  auto global = std::make_shared<CollectiveStream>(0, all_ranks, std::move(transports), config_, &timeline_,
                                                   &exiting_, [this](const std::string& why) { OnGlobalStop(why); });
  {
    std::lock_guard<std::mutex> state(state_mu_);
    topology_ = topo;
    world_transports_ = world;
    p2p_ = world->point_to_point();
    streams_ = {{0, global}};
    process_sets_ = {{0, all_ranks}};
    running_ = true;
    stop_reason_.clear();
    failed_peer_ = -1;
  }
  global->Start();
  initialized_ = true;
  return Status::OK();
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (!initialized_) {
    return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
  }
  const Topology topo = topology();
  return timeline_.Start(TimelinePathOfRank(path, topo.rank, topo.size), topo.rank, mark_cycles,
                         config_.timeline_sample_every);
}

Status Engine::Shutdown() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (initialized_) ReleaseLocked();
  return Status::OK();
}

void Engine::ReleaseLocked() {
  timeline_.Stop();
  std::map<int32_t, std::shared_ptr<CollectiveStream>> streams;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    streams.swap(streams_);
    process_sets_.clear();
    running_ = false;
    p2p_ = nullptr;
    world_transports_ = nullptr;
    initialized_ = false;
  }
  for (auto& kv : streams) kv.second->RequestShutdown();
  for (auto& kv : streams) kv.second->Join();
  {
    // Blocks handed out keep their arena mapped until TensorFlow frees them.
    std::lock_guard<std::mutex> arena(arena_mu_);
    output_arena_.reset();
  }
  // The sets' communicators go before those of all ranks they were split from.
  for (auto it = streams.rbegin(); it != streams.rend(); ++it) it->second.reset();
}

void Engine::AtProcessExit(int status) {
  exiting_ = true;
  if (status == 0) {
    Shutdown();
    FinishCommunicationRuntimeIfOwned();
    return;
  }
  if (!CommunicationRuntimeFinishPending()) return;  // never started here: nothing to wait for
  std::string who = "a rank";
  if (initialized_) who = "rank " + std::to_string(topology().rank);
  if (AnnounceFailure(who + " is exiting with code " + std::to_string(status), kFailureAnnounceSeconds)) {
    std::this_thread::sleep_for(kFailureReportGrace);
  }
  // Finishing the runtime would wait for every peer, however long they compute.
  std::fflush(nullptr);
  _exit(status);
}

bool Engine::AnnounceFailure(const std::string& failure, double wait_seconds) {
  std::shared_ptr<CollectiveStream> global;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!initialized_ || !running_ || streams_.count(0) == 0) return false;
    global = streams_.at(0);
  }
  global->RequestShutdown(failure);
  return global->Join(wait_seconds);
}

void Engine::OnGlobalStop(const std::string& reason) {
  std::vector<std::shared_ptr<CollectiveStream>> sets;
  PointToPointChannel* p2p = nullptr;
  int failed = -1;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    running_ = false;
    stop_reason_ = reason;
    for (const auto& kv : streams_) {
      if (kv.first == 0) {
        failed_peer_ = failed = kv.second->failed_peer();
      } else {
        sets.push_back(kv.second);
      }
    }
    p2p = p2p_;
  }
  const Status aborted = Status::Aborted(reason);
  if (p2p) p2p->Abort(aborted);
  for (const auto& set : sets) set->Abort(reason, failed);
}

Status Engine::StreamOf(int32_t id, std::shared_ptr<CollectiveStream>* out) const {
  std::lock_guard<std::mutex> state(state_mu_);
  if (!initialized_) {
    return Status::PreconditionFailed(
        "smdist_tf has not been initialized: call smdist_tf.init() before any collective");
  }
  if (!running_) return Status::Aborted(stop_reason_);
  auto stream = streams_.find(id);
  if (stream != streams_.end()) {
    *out = stream->second;
    return Status::OK();
  }
  auto set = process_sets_.find(id);
  if (set == process_sets_.end()) return Status::InvalidArgument("process set " + std::to_string(id) + " is not registered");
  return NotAMemberLocked(id, set->second);
}

Status Engine::NotAMemberLocked(int32_t id, const std::vector<int>& ranks) const {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return Status::InvalidArgument("rank " + std::to_string(topology_.rank) + " is not a member of process set " +
                                 std::to_string(id) + " (ranks [" + text + "])");
}

Status Engine::Enqueue(std::vector<TensorEntry> entries, bool run_inline) {
  std::shared_ptr<CollectiveStream> stream;
  SMDIST_RETURN_IF_ERROR(StreamOf(entries.empty() ? 0 : entries.front().process_set_id, &stream));
  return stream->Enqueue(std::move(entries), run_inline);
}

Status Engine::AddProcessSet(std::vector<int> ranks, int32_t* id) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  std::map<int32_t, std::vector<int>> known;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!initialized_) {
      return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
    }
    if (!running_) return Status::Aborted(stop_reason_);
    known = process_sets_;
  }
  // The lowest free id, as Horovod reuses removed sets' ids; every rank knows the same sets.
  int32_t new_id = 1;
  while (known.count(new_id)) ++new_id;
  // The same library on every rank: every rank refuses alike.
  if (!runtime_threads_multiple_) {
    return Status::PreconditionFailed(Transports::process_sets_missing());
  }
  ProcessSetProposal mine;
  mine.kind = ProcessSetProposal::Kind::kAdd;
  mine.ranks = ranks;
  ControlPlane* registration = world_transports_->registration();
  SMDIST_RETURN_IF_ERROR(AgreeOnProcessSetProposal(registration, mine, known));
  std::sort(ranks.begin(), ranks.end());
  std::unique_ptr<Transports> transports;
  Status made = world_transports_->CreateForMembers(config_, ranks, &transports);
  // Set up everywhere or nowhere: a rank that failed (say, out of shared
  // memory) must not leave the others with a set it does not have.
  std::vector<uint64_t> all_made = {made.ok() ? 1u : 0u};
  SMDIST_RETURN_IF_ERROR(registration->AllreduceBits(&all_made, /*bitwise_and=*/true));
  if (!made.ok()) return made;
  if (all_made[0] == 0) {
    return Status::Aborted("process set " + std::to_string(new_id) + " could not be set up on another rank");
  }
  ResetNumberedNames(new_id);
  std::shared_ptr<CollectiveStream> stream;
  if (transports) {
    stream = std::make_shared<CollectiveStream>(new_id, ranks, std::move(transports), config_, &timeline_,
                                                &exiting_, nullptr);
  }
  {
    std::lock_guard<std::mutex> state(state_mu_);
    process_sets_[new_id] = ranks;
    if (stream) streams_[new_id] = stream;
  }
  if (stream) stream->Start();
  LogInfo("process set " + std::to_string(new_id) + " added");
  *id = new_id;
  return Status::OK();
}

Status Engine::RemoveProcessSet(int32_t id) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  std::map<int32_t, std::vector<int>> known;
  std::shared_ptr<CollectiveStream> stream;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!initialized_) {
      return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
    }
    if (!running_) return Status::Aborted(stop_reason_);
    known = process_sets_;
    if (id != 0 && streams_.count(id)) stream = streams_.at(id);
  }
  ProcessSetProposal mine;
  mine.kind = ProcessSetProposal::Kind::kRemove;
  mine.id = id;
  mine.busy = stream && stream->HasInFlight();
  SMDIST_RETURN_IF_ERROR(AgreeOnProcessSetProposal(world_transports_->registration(), mine, known));
  if (stream) {
    stream->RequestShutdown();
    stream->Join();
  }
  {
    std::lock_guard<std::mutex> state(state_mu_);
    streams_.erase(id);
    process_sets_.erase(id);
  }
  LogInfo("process set " + std::to_string(id) + " removed");
  return Status::OK();
}

std::vector<int32_t> Engine::ProcessSetIds() const {
  std::lock_guard<std::mutex> state(state_mu_);
  std::vector<int32_t> ids;
  for (const auto& kv : process_sets_) ids.push_back(kv.first);
  return ids;
}

Status Engine::Membership(int32_t process_set_id, ProcessSetMembership* out, bool require_member) const {
  std::lock_guard<std::mutex> state(state_mu_);
  if (!initialized_) {
    return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
  }
  auto set = process_sets_.find(process_set_id);
  if (set == process_sets_.end()) {
    return Status::InvalidArgument("process set " + std::to_string(process_set_id) + " is not registered");
  }
  out->ranks = set->second;
  auto at = std::lower_bound(out->ranks.begin(), out->ranks.end(), topology_.rank);
  out->rank = at != out->ranks.end() && *at == topology_.rank ? static_cast<int>(at - out->ranks.begin()) : -1;
  if (require_member && out->rank < 0) return NotAMemberLocked(process_set_id, out->ranks);
  return Status::OK();
}

Status Engine::CachedNames(std::vector<std::string>* out) {
  std::shared_ptr<CollectiveStream> global;
  SMDIST_RETURN_IF_ERROR(StreamOf(0, &global));
  *out = global->cached_names();
  return Status::OK();
}

Status Engine::CyclesRun(uint64_t* out) {
  std::shared_ptr<CollectiveStream> global;
  SMDIST_RETURN_IF_ERROR(StreamOf(0, &global));
  *out = global->cycles_run();
  return Status::OK();
}

std::vector<std::string> Engine::DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
                                                       WireCompression compression, double prescale) {
  std::shared_ptr<CollectiveStream> global;
  if (!StreamOf(0, &global).ok()) return {};
  return global->DescribeAllreducePlan(counts, dtype, compression, prescale);
}

bool Engine::owns_runtime() const { return CommunicationRuntimeStartedHere(); }

int Engine::failed_peer() const {
  std::lock_guard<std::mutex> state(state_mu_);
  if (failed_peer_ >= 0) return failed_peer_;
  // A process set can hear of the failure (relayed by a member) before this rank's own engine stream does.
  for (const auto& kv : streams_) {
    if (kv.first != 0 && kv.second->failed_peer() >= 0) return kv.second->failed_peer();
  }
  return -1;
}

std::string Engine::intra_host_allreduce() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return world_transports_ ? world_transports_->intra_host_allreduce() : std::string();
}

int64_t Engine::negotiation_busy_poll_us() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return world_transports_ != nullptr ? world_transports_->negotiation_busy_poll().count() : 0;
}

Topology Engine::topology() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return topology_;
}

std::unique_ptr<SharedOutputBlock> Engine::AllocateSharedOutput(int64_t bytes) {
  std::shared_ptr<SharedOutputArena> arena;
  {
    std::lock_guard<std::mutex> lock(arena_mu_);
    arena = output_arena_;
  }
  return arena ? arena->Allocate(bytes) : nullptr;
}

int64_t Engine::shared_output_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(arena_mu_);
  return output_arena_ ? output_arena_->bytes_in_use() : 0;
}

EngineConfig Engine::config() const {
  EngineConfig c;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    c = config_;
  }
  std::shared_ptr<CollectiveStream> global;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    auto it = streams_.find(0);
    if (it != streams_.end()) global = it->second;
  }
  TunableParameters tuned;
  if (global && global->tuned_parameters(&tuned, &c.autotune_finished)) {  // what is in force now
    c.fusion_threshold_bytes = tuned.fusion_threshold_bytes;
    c.cycle_time_ms = tuned.cycle_time_ms;
    c.shm_min_bytes = tuned.shm_min_bytes;
    c.cross_memory_min_bytes = tuned.cross_memory_min_bytes;
  }
  return c;
}

Status Engine::PointToPointReadyLocked() const {
  if (!initialized_) {
    return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
  }
  if (!p2p_) {
    return Status::PreconditionFailed(Transports::point_to_point_missing());
  }
  return Status::OK();
}

Status Engine::Send(SendMessage message) {
  std::lock_guard<std::mutex> state(state_mu_);
  SMDIST_RETURN_IF_ERROR(PointToPointReadyLocked());
  return p2p_->Send(std::move(message));
}

Status Engine::Recv(RecvMessage message) {
  std::lock_guard<std::mutex> state(state_mu_);
  SMDIST_RETURN_IF_ERROR(PointToPointReadyLocked());
  return p2p_->Recv(std::move(message));
}

}  // namespace smdist
