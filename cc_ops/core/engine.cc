#include "engine.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "collective_executor.h"
#include "common/logging.h"
#include "control/coordinator.h"
#include "control/fusion_planner.h"
#include "control/numbered_names.h"
#include "control/response_cache.h"
#include "joined_participation.h"

namespace smdist {

struct Engine::CycleState {
  CycleState(const Transports& transports, const EngineConfig& config, Timeline* timeline)
      : cache(config.cache_capacity),
        planner(config.fusion_threshold_bytes),
        coordinator(transports.topology().size, &planner,
                    StallInspector(config.stall_check_seconds, config.stall_shutdown_seconds),
                    config.cache_capacity > 0 ? &cache : nullptr),
        executor(transports.topology(), transports.data_plane(), &planner, timeline) {}

  struct CachedPending {
    Request request;
    std::chrono::steady_clock::time_point since;
  };
  ResponseCache cache;
  FusionPlanner planner;  // one for negotiation (both paths) and execution
  Coordinator coordinator;
  CollectiveExecutor executor;
  std::map<int64_t, CachedPending> cached_pending;  // by cache bit
  std::vector<Request> requeued;  // evicted while pending: renegotiate in full
  bool joined = false;  // this rank's join() is in flight
};

Engine& Engine::Instance() {
  static Engine instance;
  return instance;
}

namespace {
// Set while this thread runs a cycle: a done callback that submits another
// collective from inside the cycle must queue it, not start a nested cycle.
thread_local bool t_in_cycle = false;

// How long a failing rank waits for its peers to learn why it leaves, and
// then for them to report it before its exit makes the launcher stop them.
constexpr double kFailureAnnounceSeconds = 1.0;
constexpr auto kFailureReportGrace = std::chrono::milliseconds(300);

void OnProcessExit(int status, void*) { Engine::Instance().AtProcessExit(status); }
}  // namespace

Engine::~Engine() {
  // AtProcessExit() normally joined the thread; a process exiting without it
  // must not abort in std::thread's destructor. The cycle state is then
  // leaked on purpose: the detached thread may still use it.
  if (thread_.joinable()) {
    thread_.detach();
    (void)cycle_state_.release();
  }
}

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
  if (!config_.timeline_path.empty()) {
    // While nothing else holds the transports, so a refused path fails init cleanly.
    const Topology& topo = transports->topology();
    SMDIST_RETURN_IF_ERROR(timeline_.Start(TimelinePathOfRank(config_.timeline_path, topo.rank, topo.size),
                                           topo.rank, config_.timeline_mark_cycles));
  }
  config_.cross_memory_min_bytes = transports->cross_memory_min_bytes();
  config_.cross_memory_min_measured = transports->cross_memory_min_measured();
  {
    std::lock_guard<std::mutex> arena(arena_mu_);
    output_arena_ = transports->output_arena();
  }
  config_.shared_output_bytes = output_arena_ ? output_arena_->capacity() : 0;
  transports_ = std::move(transports);
  p2p_ = transports_->point_to_point();
  SetLogRank(transports_->topology().rank);
  if (LogEnabled(LogLevel::kInfo)) {
    const Topology& t = transports_->topology();
    LogInfo("engine started: rank " + std::to_string(t.rank) + " of " + std::to_string(t.size) + " on host " +
            config_.hostname + " (local rank " + std::to_string(t.local_rank) + " of " +
            std::to_string(t.local_size) + ", host " + std::to_string(t.cross_rank) + " of " +
            std::to_string(t.cross_size) + "); intra-host allreduce: " + transports_->intra_host_allreduce() +
            "; fusion threshold " + std::to_string(config_.fusion_threshold_bytes) + " bytes, cycle time " +
            FormatNumber(config_.cycle_time_ms) + " ms, response cache " + std::to_string(config_.cache_capacity));
  }
  queue_ = std::make_unique<TensorQueue>();
  shutdown_requested_ = false;
  loop_done_ = false;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    running_ = true;
    stop_reason_.clear();
    exit_failure_.clear();
    failed_peer_ = -1;
  }
  cycle_state_ = std::make_unique<CycleState>(*transports_, config_, &timeline_);
  cycles_over_ = false;
  thread_ = std::thread(&Engine::BackgroundLoop, this);
  initialized_ = true;
  return Status::OK();
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (!initialized_) {
    return Status::PreconditionFailed("smdist_tf has not been initialized: call smdist_tf.init() first");
  }
  const Topology& topo = transports_->topology();
  return timeline_.Start(TimelinePathOfRank(path, topo.rank, topo.size), topo.rank, mark_cycles);
}

Status Engine::Shutdown() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (initialized_) ReleaseLocked();
  return Status::OK();
}

void Engine::ReleaseLocked() {
  timeline_.Stop();
  shutdown_requested_ = true;
  queue_->Wake();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> cycle(cycle_mu_);
    cycles_over_ = true;
    cycle_state_.reset();
  }
  initialized_ = false;
  {
    // Blocks handed out keep their arena mapped until TensorFlow frees them.
    std::lock_guard<std::mutex> arena(arena_mu_);
    output_arena_.reset();
  }
  p2p_ = nullptr;
  queue_.reset();
  transports_.reset();
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
  {
    std::unique_lock<std::mutex> lock(lifecycle_mu_, std::try_to_lock);
    if (lock.owns_lock() && transports_) who = "rank " + std::to_string(transports_->topology().rank);
  }
  if (AnnounceFailure(who + " is exiting with code " + std::to_string(status), kFailureAnnounceSeconds)) {
    std::this_thread::sleep_for(kFailureReportGrace);
  }
  // Finishing the runtime would wait for every peer, however long they compute.
  std::fflush(nullptr);
  _exit(status);
}

bool Engine::AnnounceFailure(const std::string& failure, double wait_seconds) {
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!initialized_ || !running_) return false;
    exit_failure_ = failure;
  }
  shutdown_requested_ = true;
  queue_->Wake();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  while (!loop_done_ && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return loop_done_;
}

std::vector<std::string> Engine::cached_names() {
  std::lock_guard<std::mutex> cycle(cycle_mu_);
  return cycle_state_ ? cycle_state_->cache.NamesByRecency() : std::vector<std::string>();
}

std::vector<std::string> Engine::DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
                                                       WireCompression compression, double prescale) {
  std::vector<TensorEntry> entries(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    entries[i].dtype = dtype;
    entries[i].shape = {counts[i]};
    entries[i].compression = compression;
    entries[i].prescale = prescale;
  }
  std::lock_guard<std::mutex> cycle(cycle_mu_);
  std::vector<std::string> lines;
  if (!cycle_state_ || entries.empty()) return lines;
  for (const AllreduceStep& step : cycle_state_->planner.PlanAllreduce(entries, transports_->data_plane())) {
    std::string line = (step.transport ? step.transport->name() : "none") + (step.packed ? " packed " : " in_place ");
    for (size_t i = 0; i < step.members.size(); ++i) line += (i ? "," : "") + std::to_string(step.members[i]);
    lines.push_back(std::move(line));
  }
  return lines;
}

bool Engine::owns_runtime() const { return CommunicationRuntimeStartedHere(); }

int Engine::failed_peer() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return failed_peer_;
}

std::string Engine::intra_host_allreduce() const {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  return transports_ ? transports_->intra_host_allreduce() : std::string();
}

Topology Engine::topology() const {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  return transports_ ? transports_->topology() : Topology();
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
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  return config_;
}

Status Engine::Enqueue(std::vector<TensorEntry> entries, bool run_inline) {
  std::unique_lock<std::mutex> cycle(cycle_mu_, std::defer_lock);
  if (run_inline && !t_in_cycle) cycle.try_lock();
  const bool inline_cycle = cycle.owns_lock() && !cycles_over_;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!initialized_) {
      return Status::PreconditionFailed(
          "smdist_tf has not been initialized: call smdist_tf.init() before any collective");
    }
    if (!running_) return Status::Aborted(stop_reason_);
    SMDIST_RETURN_IF_ERROR(
        queue_->Add(std::move(entries), transports_->topology().rank, /*wake=*/!inline_cycle));
  }
  if (!inline_cycle) return Status::OK();
  // Peers not all there yet: the engine thread carries on from here. Woken
  // before cycle_mu_ is released, as Shutdown frees the queue only after
  // taking cycle_mu_.
  if (RunCycleLocked() && queue_->HasInFlight()) queue_->Wake();
  return Status::OK();
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

void Engine::Stop(const std::string& reason) {
  LogInfo("engine stopped: " + reason);
  {
    std::lock_guard<std::mutex> state(state_mu_);
    running_ = false;
    stop_reason_ = reason;
  }
  const Status aborted = Status::Aborted(reason);
  if (p2p_) p2p_->Abort(aborted);
  for (TensorEntry& e : queue_->TakeAll()) {
    if (e.done && !exiting_) e.done(aborted);
  }
}


void Engine::BackgroundLoop() {
  const int64_t cycle_us = static_cast<int64_t>(config_.cycle_time_ms * 1000.0);
  const int64_t idle_cap_us = std::max(cycle_us, kIdleWaitCapUs);
  int64_t idle_wait_us = cycle_us;
  uint64_t cycles_seen = cycles_run_.load();
  while (true) {
    // Sleep only when idle: a rank with collectives in flight goes straight to
    // the next cycle, so a lone tensor never waits out a cycle for its peers.
    if (!queue_->HasInFlight()) {
      const bool woken = queue_->WaitForWork(idle_wait_us);
      if (!woken && !queue_->HasInFlight()) {
        // Still idle. Negotiate now and then (a peer, a shutdown or a stall may
        // need this rank), but ever less often: each idle round is a collective call
        // that takes a core and the runtime library from the training step. Its
        // own submissions wake this thread at once, so no collective waits.
        idle_wait_us = std::min(idle_cap_us, std::max(cycle_us, 2 * idle_wait_us));
        const uint64_t cycles = cycles_run_.load();
        const bool callers_cycled = cycles != cycles_seen;
        cycles_seen = cycles;
        if (callers_cycled) continue;  // callers ran cycles inline meanwhile
      } else {
        idle_wait_us = cycle_us;
      }
    }
    std::lock_guard<std::mutex> cycle(cycle_mu_);
    if (!RunCycleLocked()) {
      loop_done_ = true;
      return;
    }
    cycles_seen = cycles_run_.load();
  }
}

bool Engine::RunCycleLocked() {
  if (cycles_over_) return false;
  t_in_cycle = true;
  cycles_run_.fetch_add(1);
  const bool go_on = RunCycle(cycle_state_.get());
  t_in_cycle = false;
  if (!go_on) cycles_over_ = true;
  return go_on;
}

namespace {
constexpr uint64_t kNotShuttingDown = 1, kNothingUncached = 2, kNoStallSuspected = 4,
                   kCoordinatorIdle = 8, kNobodyJoined = 16;
constexpr uint64_t kFastPath = kNotShuttingDown | kNothingUncached | kCoordinatorIdle | kNobodyJoined;

bool TestBit(const std::vector<uint64_t>& words, int64_t bit) {
  return (words[1 + bit / 64] >> (bit % 64)) & 1u;
}
}  // namespace

Status Engine::NegotiateCached(CycleState* state, std::vector<Request>* uncached,
                               std::vector<Response>* ready, bool* needs_full) {
  ResponseCache& cache = state->cache;
  const auto now = std::chrono::steady_clock::now();
  // A cached collective pending this long is renegotiated in full so rank 0's
  // stall inspector can name the missing ranks.
  double stall_after = config_.stall_check_seconds;
  if (stall_after <= 0 || (config_.stall_shutdown_seconds > 0 &&
                           config_.stall_shutdown_seconds < stall_after)) {
    stall_after = config_.stall_shutdown_seconds;
  }
  bool stall_suspected = false;
  std::vector<uint64_t> words(1 + (cache.capacity() + 63) / 64, 0);
  for (const auto& kv : state->cached_pending) {
    words[1 + kv.first / 64] |= uint64_t{1} << (kv.first % 64);
    const double waited = std::chrono::duration<double>(now - kv.second.since).count();
    stall_suspected |= stall_after > 0 && waited >= stall_after;
  }
  if (!shutdown_requested_) words[0] |= kNotShuttingDown;
  if (uncached->empty()) words[0] |= kNothingUncached;
  if (!stall_suspected) words[0] |= kNoStallSuspected;
  if (!state->coordinator.HasPending()) words[0] |= kCoordinatorIdle;  // only rank 0's can be busy
  if (!state->joined) words[0] |= kNobodyJoined;
  std::vector<uint64_t> mine = words;
  SMDIST_RETURN_IF_ERROR(transports_->control()->AllreduceBits(&words, /*bitwise_and=*/true));

  std::vector<int64_t> ready_bits;
  for (const auto& kv : state->cached_pending) {
    if (TestBit(words, kv.first)) ready_bits.push_back(kv.first);  // ascending: same order everywhere
  }
  std::unordered_map<std::string, int64_t> bit_of;
  for (int64_t bit : ready_bits) {
    cache.Touch(bit);  // in ascending bit order: the same recency on every rank
    Response r = cache.response(bit);
    r.names = {cache.name(bit)};
    bit_of[cache.name(bit)] = bit;
    ready->push_back(std::move(r));
    state->cached_pending.erase(bit);
  }
  state->planner.Fuse(ready, [&cache, &bit_of](const std::string& name) -> const Request& {
    return cache.params(bit_of.at(name));
  });
  *needs_full = (words[0] & kFastPath) != kFastPath;
  if ((words[0] & kNoStallSuspected) == 0) {
    // Everyone forgets every collective still pending anywhere and sends the
    // ones it holds in full; the same evictions happen on every rank.
    std::vector<uint64_t> any = mine;
    any[0] = 0;
    SMDIST_RETURN_IF_ERROR(transports_->control()->AllreduceBits(&any, /*bitwise_and=*/false));
    for (int64_t bit = 0; bit < cache.capacity(); ++bit) {
      if (!TestBit(any, bit)) continue;
      auto it = state->cached_pending.find(bit);
      if (it != state->cached_pending.end()) {
        uncached->push_back(it->second.request);
        state->cached_pending.erase(it);
      }
      cache.Erase(cache.name(bit));
    }
    *needs_full = true;
  }
  if ((words[0] & kNobodyJoined) == 0) {
    // A joined rank sets no bits, so none of these can become ready here:
    // the coordinator completes them without it. They stay cached.
    for (auto& kv : state->cached_pending) {
      kv.second.request.cached = true;
      uncached->push_back(std::move(kv.second.request));
    }
    state->cached_pending.clear();
  }
  return Status::OK();
}

Status Engine::NegotiateFull(CycleState* state, std::vector<Request> uncached, ResponseList* out) {
  RequestList mine;
  mine.requests = std::move(uncached);
  mine.shutdown = shutdown_requested_.load();
  if (mine.shutdown) {
    std::lock_guard<std::mutex> lock(state_mu_);
    mine.failure = exit_failure_;
  }
  std::vector<std::vector<uint8_t>> gathered;
  SMDIST_RETURN_IF_ERROR(transports_->control()->GatherToRoot(mine.Serialize(), &gathered));
  std::vector<uint8_t> bytes;
  if (transports_->topology().rank == 0) {
    for (size_t r = 0; r < gathered.size(); ++r) {
      RequestList list;
      if (!RequestList::Parse(gathered[r].data(), gathered[r].size(), &list)) {
        return Status::Unknown("malformed request list from rank " + std::to_string(r));
      }
      state->coordinator.Add(list, static_cast<int>(r));
    }
    bytes = state->coordinator.BuildResponses().Serialize();
  }
  SMDIST_RETURN_IF_ERROR(transports_->control()->BroadcastFromRoot(&bytes));
  if (!ResponseList::Parse(bytes.data(), bytes.size(), out)) {
    return Status::Unknown("malformed response list");
  }
  return Status::OK();
}

bool Engine::Execute(CycleState* state, const Response& response, bool remember) {
  const int me = transports_->topology().rank;
  const bool joined_here = std::find(response.joined.begin(), response.joined.end(), me) != response.joined.end();
  if (joined_here) {
    for (const std::string& name : response.names) SkipNumberedName(name);
  }
  if (joined_here && response.response_type == ResponseType::kError) {
    // The collective cannot complete without this rank: its join() fails
    // with the same error, so every rank sees it. Only the join that was in
    // flight: one submitted since then is not negotiated yet.
    if (state->joined) {
      state->joined = false;
      TensorEntry join;
      Request join_request;
      if (queue_->Take(kJoinName, &join, &join_request) && join.done) {
        join.done(Status::PreconditionFailed(response.error));
      }
    }
    return true;
  }
  std::vector<TensorEntry> entries(response.names.size());
  std::vector<Request> requests(response.names.size());
  JoinedParticipation participation;  // outlives the execution below
  for (size_t i = 0; i < response.names.size(); ++i) {
    if (queue_->Take(response.names[i], &entries[i], &requests[i])) continue;
    if (joined_here && i < response.params.size()) {
      entries[i] = participation.Entry(response.params[i]);
      continue;
    }
    Stop("internal error: negotiated collective '" + response.names[i] +
         "' is unknown on this rank");
    return false;
  }
  Status s = state->executor.Execute(response, &entries);
  if (!s.ok()) {
    Stop("collective failed: " + s.message());
    return false;
  }
  if (response.type == CollectiveType::kJoin) state->joined = false;
  // Join, and collectives some rank took part in without an entry, happen
  // only now: there is nothing to remember.
  if (remember && response.response_type == ResponseType::kCollective && response.joined.empty() &&
      response.type != CollectiveType::kJoin && state->cache.capacity() > 0) {
    // Every rank executes the same responses in the same order, so every
    // cache assigns the same bits.
    // Copied once without its names: copying a fused response per member made
    // remembering a group of n tensors cost n^2 name copies.
    Response single = response;
    single.names.clear();
    for (const Request& request : requests) {
      // Numbered unnamed eager collectives ("allreduce.noname.7") never recur:
      // caching them would only crowd out the ones that do. A rule on the name
      // alone, which every rank shares, keeps the caches' bits in step.
      if (IsNumberedCallName(request.name)) continue;
      single.names.assign(1, request.name);
      const int64_t evicted = state->cache.Put(request, single);
      auto pending = state->cached_pending.find(evicted);
      if (pending != state->cached_pending.end()) {
        // Submitted here as cached, now evicted everywhere: negotiate it in full.
        state->requeued.push_back(std::move(pending->second.request));
        state->cached_pending.erase(pending);
      }
    }
  }
  return true;
}

namespace {
// "allreduce of 3 tensor(s): a, b, c" (the first few names) for debug logs.
std::string DescribeResponse(const Response& response) {
  constexpr size_t kNamesShown = 8;
  std::string text = response.response_type == ResponseType::kError
                         ? std::string("error for")
                         : std::string(CollectiveTypeName(response.type)) + " of";
  text += " " + std::to_string(response.names.size()) + " tensor(s):";
  for (size_t i = 0; i < response.names.size() && i < kNamesShown; ++i) {
    text += (i == 0 ? " " : ", ") + response.names[i];
  }
  if (response.names.size() > kNamesShown) {
    text += ", ... (" + std::to_string(response.names.size() - kNamesShown) + " more)";
  }
  return text;
}
}  // namespace

bool Engine::RunCycle(CycleState* state) {
  const auto cycle_start = Timeline::Clock::now();
  std::vector<Request> fresh;
  queue_->PopRequests(&fresh);
  for (const Request& r : fresh) state->joined |= r.type == CollectiveType::kJoin;
  std::vector<Request> uncached = std::move(state->requeued);
  state->requeued.clear();

  std::vector<Response> cached_ready;
  bool needs_full = true;
  Status s;
  if (state->cache.capacity() > 0) {
    const auto now = std::chrono::steady_clock::now();
    for (Request& r : fresh) {
      const int64_t bit = state->cache.Lookup(r);
      if (bit >= 0) {
        state->cached_pending[bit] = CycleState::CachedPending{std::move(r), now};
      } else {
        uncached.push_back(std::move(r));
      }
    }
    s = NegotiateCached(state, &uncached, &cached_ready, &needs_full);
  } else {
    for (Request& r : fresh) uncached.push_back(std::move(r));
  }
  ResponseList full;
  if (s.ok() && needs_full) s = NegotiateFull(state, std::move(uncached), &full);
  if (!s.ok()) {
    Stop("negotiation failed: " + s.message());
    return false;
  }

  // Marked before executing: completing a collective can let its caller stop
  // the timeline (or shut down) before this cycle ends.
  const size_t responses = cached_ready.size() + full.responses.size();
  // Counted only for a reader: this runs every working cycle.
  if (responses > 0 && (timeline_.active() || LogEnabled(LogLevel::kTrace))) {
    size_t tensors = 0;
    for (const Response& r : cached_ready) tensors += r.names.size();
    for (const Response& r : full.responses) tensors += r.names.size();
    timeline_.MarkCycle(cycle_start, tensors);
    if (LogEnabled(LogLevel::kTrace)) {
      LogTrace("cycle runs " + std::to_string(responses) + " response(s) of " + std::to_string(tensors) +
               " tensor(s): " + std::to_string(cached_ready.size()) + " cached, " +
               std::to_string(full.responses.size()) + " negotiated");
    }
  }
  for (const Response& response : cached_ready) {
    if (!Execute(state, response, /*remember=*/false)) return false;
  }
  for (const std::string& name : full.evictions) {
    // Some rank changed this collective: forget it everywhere; a rank that
    // had it pending as cached sends it in full next cycle.
    for (auto it = state->cached_pending.begin(); it != state->cached_pending.end(); ++it) {
      if (it->second.request.name == name) {
        state->requeued.push_back(it->second.request);
        state->cached_pending.erase(it);
        break;
      }
    }
    state->cache.Erase(name);
  }
  for (const Response& response : full.responses) {
    if (LogEnabled(LogLevel::kDebug)) LogDebug("negotiated " + DescribeResponse(response));
    if (!Execute(state, response, /*remember=*/true)) return false;
  }
  if (full.shutdown) {
    if (full.shutdown_error.rfind("stall", 0) == 0) LogError(full.shutdown_error);
    if (full.failed_rank >= 0 && full.failed_rank != transports_->topology().rank) {
      std::lock_guard<std::mutex> lock(state_mu_);
      failed_peer_ = full.failed_rank;
    }
    Stop(full.shutdown_error);
    return false;
  }
  return true;
}

}  // namespace smdist
