#include "collective_stream.h"

#include <algorithm>
#include <chrono>

#include "collective_executor.h"
#include "common/logging.h"
#include "common/numbered_names.h"
#include "control/fusion_planner.h"
#include "control/negotiator.h"
#include "control/parameter_tuner.h"
#include "joined_participation.h"

namespace smdist {

struct CollectiveStream::CycleState {
  CycleState(const Transports& transports, const std::vector<int>& members, const EngineConfig& config,
             Timeline* timeline, int32_t process_set_id)
      : planner(config.fusion_threshold_bytes),
        negotiator(members, config, &planner, transports.control()),
        executor(transports.topology(), transports.data_plane(), &planner, timeline, process_set_id) {}

  FusionPlanner planner;  // one for negotiation (both paths) and execution
  Negotiator negotiator;
  CollectiveExecutor executor;
  std::unique_ptr<ParameterTuner> tuner;  // SMDIST_AUTOTUNE, process set 0 only
  int64_t cycle_bytes = 0;                // moved by this cycle's collectives, while tuning
  int64_t working_cycles = 0;             // cycles that ran collectives, for timeline sampling
};

namespace {
// Set while this thread runs a cycle: a done callback that submits another
// collective from inside the cycle must queue it, not start a nested cycle.
thread_local bool t_in_cycle = false;
}  // namespace

CollectiveStream::CollectiveStream(int32_t id, std::vector<int> members, std::unique_ptr<Transports> transports,
                                   const EngineConfig& config, Timeline* timeline,
                                   const std::atomic<bool>* exiting,
                                   std::function<void(const std::string& reason)> on_stop)
    : id_(id),
      members_(std::move(members)),
      transports_(std::move(transports)),
      config_(config),
      timeline_(timeline),
      exiting_(exiting),
      on_stop_(std::move(on_stop)),
      cycle_state_(std::make_unique<CycleState>(*transports_, members_, config_, timeline_, id_)),
      cycle_us_(static_cast<int64_t>(config_.cycle_time_ms * 1000.0)) {
  if (config_.autotune && id_ == 0) {
    // The job's own settings are the starting point and the fallback.
    tuned_ = {config_.fusion_threshold_bytes, config_.cycle_time_ms, config_.shm_min_bytes,
              transports_->cross_memory_min_bytes()};
    TunerSettings settings;
    settings.warmup_samples = static_cast<int>(config_.autotune_warmup_samples);
    settings.cycles_per_sample = static_cast<int>(config_.autotune_steps_per_sample);
    settings.log_path = config_.autotune_log;
    cycle_state_->tuner = std::make_unique<ParameterTuner>(tuned_, settings, transports_->has_shared_memory(),
                                                           transports_->has_cross_memory());
    tuning_ = true;
  }
}

CollectiveStream::~CollectiveStream() {
  // A thread that never ended (a process leaving without shutting down) must
  // not abort in std::thread's destructor; its state is then leaked on
  // purpose, as the thread may still use it.
  if (thread_.joinable()) {
    thread_.detach();
    (void)cycle_state_.release();
    (void)transports_.release();
  }
}

void CollectiveStream::Start() { thread_ = std::thread(&CollectiveStream::BackgroundLoop, this); }

int CollectiveStream::MemberIndex(int rank) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), rank);
  return it != members_.end() && *it == rank ? static_cast<int>(it - members_.begin()) : -1;
}

Status CollectiveStream::Enqueue(std::vector<TensorEntry> entries, bool run_inline) {
  for (TensorEntry& e : entries) {
    if (e.type == CollectiveType::kAllreduce && e.compression == WireCompression::kInt8 &&
        IsFloatingPoint(e.dtype) && e.reduce_op != ReduceOp::kSum && e.reduce_op != ReduceOp::kAverage &&
        e.local_error.empty()) {
      // Every rank submits the same op, so every rank reports this.
      e.local_error = "allreduce of '" + e.name + "': Compression.int8 reduces with Sum or Average, not " +
                      ReduceOpName(e.reduce_op);
    }
    if (e.type != CollectiveType::kBroadcast || !e.local_error.empty()) continue;
    // Roots are named by world rank; the set's transports count members.
    const int root = MemberIndex(e.root_rank);
    if (root >= 0) {
      e.root_rank = root;
    } else if (id_ == 0) {
      e.local_error = "broadcast of '" + e.name + "': root_rank " + std::to_string(e.root_rank) +
                      " is out of range for " + std::to_string(members_.size()) + " ranks";
    } else {
      e.local_error = "broadcast of '" + e.name + "': root_rank " + std::to_string(e.root_rank) +
                      " is not a member of process set " + std::to_string(id_);
    }
  }
  std::unique_lock<std::mutex> cycle(cycle_mu_, std::defer_lock);
  if (run_inline && !t_in_cycle) cycle.try_lock();
  const bool inline_cycle = cycle.owns_lock() && !cycles_over_;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (!running_) return Status::Aborted(stop_reason_);
    // Requests carry the job rank: negotiation errors name ranks as the user knows them.
    SMDIST_RETURN_IF_ERROR(queue_.Add(std::move(entries), members_[transports_->topology().rank],
                                      /*wake=*/!inline_cycle));
  }
  if (!inline_cycle) return Status::OK();
  // Peers not all there yet: the stream's thread carries on from here.
  if (RunCycleLocked() && queue_.HasInFlight()) queue_.Wake();
  return Status::OK();
}

void CollectiveStream::RequestShutdown(const std::string& failure) {
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (failure_.empty()) failure_ = failure;
  }
  shutdown_requested_ = true;
  queue_.Wake();
}

void CollectiveStream::Abort(const std::string& reason, int failed_peer) {
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (running_) {
      running_ = false;
      stop_reason_ = reason;
      relayed_stop_ = reason;
      if (failed_peer != members_[transports_->topology().rank]) failed_peer_ = failed_peer;
    }
  }
  // The thread fails what is queued when the members agree to stop: taking
  // entries from under a cycle would leave the members waiting for this rank.
  RequestShutdown();
}

bool CollectiveStream::Join(double seconds) {
  if (seconds >= 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!loop_done_ && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!loop_done_) return false;
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

bool CollectiveStream::running() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return running_;
}

int CollectiveStream::failed_peer() const {
  std::lock_guard<std::mutex> state(state_mu_);
  return failed_peer_;
}

std::vector<std::string> CollectiveStream::cached_names() {
  std::lock_guard<std::mutex> cycle(cycle_mu_);
  return cycle_state_ ? cycle_state_->negotiator.cached_names() : std::vector<std::string>();
}

bool CollectiveStream::tuned_parameters(TunableParameters* out, bool* finished) const {
  std::lock_guard<std::mutex> lock(tuned_mu_);
  if (!tuning_) return false;
  *out = tuned_;
  *finished = tuning_finished_;
  return true;
}

std::vector<std::string> CollectiveStream::DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
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
  if (!cycle_state_ || cycles_over_ || entries.empty()) return lines;
  for (const AllreduceStep& step : cycle_state_->planner.PlanAllreduce(entries, transports_->data_plane())) {
    std::string line = (step.transport ? step.transport->name() : "none") + (step.packed ? " packed " : " in_place ");
    for (size_t i = 0; i < step.members.size(); ++i) line += (i ? "," : "") + std::to_string(step.members[i]);
    lines.push_back(std::move(line));
  }
  return lines;
}

void CollectiveStream::Stop(const std::string& reason, bool report) {
  std::string why;
  {
    std::lock_guard<std::mutex> state(state_mu_);
    if (running_) {
      running_ = false;
      stop_reason_ = reason;
    } else {
      report = false;  // aborted before: that reason stands
    }
    why = stop_reason_;
  }
  LogInfo((id_ == 0 ? std::string("engine") : "process set " + std::to_string(id_)) + " stopped: " + why);
  if (report && on_stop_) on_stop_(why);
  const Status aborted = Status::Aborted(why);
  for (TensorEntry& e : queue_.TakeAll()) {
    if (e.done && !exiting_->load()) e.done(aborted);
  }
}

void CollectiveStream::BackgroundLoop() {
  int64_t idle_wait_us = cycle_us_.load();
  uint64_t cycles_seen = cycles_run_.load();
  while (true) {
    const int64_t cycle_us = cycle_us_.load();
    const int64_t idle_cap_us = std::max(cycle_us, kIdleWaitCapUs);
    // Sleep only when idle: a rank with collectives in flight goes straight to
    // the next cycle, so a lone tensor never waits out a cycle for its peers.
    if (!queue_.HasInFlight()) {
      const bool woken = queue_.WaitForWork(idle_wait_us);
      if (!woken && !queue_.HasInFlight()) {
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

bool CollectiveStream::RunCycleLocked() {
  if (cycles_over_) return false;
  t_in_cycle = true;
  cycles_run_.fetch_add(1);
  const bool go_on = RunCycle(cycle_state_.get());
  t_in_cycle = false;
  if (!go_on) cycles_over_ = true;
  return go_on;
}

Status CollectiveStream::SyncTuning(CycleState* state) {
  const auto now = std::chrono::steady_clock::now();
  const bool root = transports_->topology().rank == 0;
  std::vector<uint8_t> bytes;
  if (root) bytes = state->tuner->Advance(now).Serialize();
  SMDIST_RETURN_IF_ERROR(transports_->control()->BroadcastFromRoot(&bytes));
  TuningStep step;
  if (!TuningStep::Parse(bytes, &step)) return Status::Unknown("malformed autotune step from rank 0");
  state->tuner->Adopt(step, now);
  const TunableParameters& p = step.parameters;
  state->planner.set_threshold_bytes(p.fusion_threshold_bytes);
  cycle_us_.store(static_cast<int64_t>(p.cycle_time_ms * 1000.0));
  transports_->SetSizeThresholds(p.shm_min_bytes, p.cross_memory_min_bytes);
  {
    std::lock_guard<std::mutex> lock(tuned_mu_);
    tuned_ = p;
    tuned_.cross_memory_min_bytes = transports_->cross_memory_min_bytes();  // as clamped
    tuning_finished_ = step.finished;
  }
  if (step.finished && root) LogResult(state->tuner->summary());
  return Status::OK();
}

bool CollectiveStream::Execute(CycleState* state, const Response& response, bool remember) {
  const int me = transports_->topology().rank;
  const bool joined_here = std::find(response.joined.begin(), response.joined.end(), me) != response.joined.end();
  if (joined_here) {
    for (const std::string& name : response.names) SkipNumberedName(name);
  }
  if (joined_here && response.response_type == ResponseType::kError) {
    // The collective cannot complete without this rank: its join() fails
    // with the same error, so every rank sees it. Only the join that was in
    // flight: one submitted since then is not negotiated yet.
    if (state->negotiator.join_in_flight()) {
      state->negotiator.JoinEnded();
      TensorEntry join;
      Request join_request;
      if (queue_.Take(kJoinName, &join, &join_request) && join.done) {
        join.done(Status::PreconditionFailed(response.error));
      }
    }
    return true;
  }
  std::vector<TensorEntry> entries(response.names.size());
  std::vector<Request> requests(response.names.size());
  JoinedParticipation participation;  // outlives the execution below
  for (size_t i = 0; i < response.names.size(); ++i) {
    if (queue_.Take(response.names[i], &entries[i], &requests[i])) continue;
    if (joined_here && i < response.params.size()) {
      entries[i] = participation.Entry(response.params[i]);
      continue;
    }
    Stop("internal error: negotiated collective '" + response.names[i] + "' is unknown on this rank",
         /*report=*/true);
    return false;
  }
  Status s = state->executor.Execute(response, &entries);
  if (!s.ok()) {
    Stop("collective failed: " + s.message(), /*report=*/true);
    return false;
  }
  if (state->tuner && !state->tuner->finished() &&
      (response.type == CollectiveType::kAllreduce || response.type == CollectiveType::kBroadcast ||
       response.type == CollectiveType::kReducescatter)) {
    // Shapes every rank shares (unlike allgather's), so every rank counts alike.
    for (const TensorEntry& e : entries) {
      state->cycle_bytes += NumElements(e.shape) * static_cast<int64_t>(DataTypeSize(e.dtype));
    }
  }
  if (response.type == CollectiveType::kJoin) state->negotiator.JoinEnded();
  if (remember) state->negotiator.Remember(response, requests);
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

bool CollectiveStream::RunCycle(CycleState* state) {
  const auto cycle_start = Timeline::Clock::now();
  std::vector<Request> fresh;
  queue_.PopRequests(&fresh);
  std::vector<Request> uncached;
  std::vector<Response> cached_ready;
  bool needs_full = true;
  Status s = state->negotiator.NegotiateCached(std::move(fresh), shutdown_requested_.load(), &uncached,
                                               &cached_ready, &needs_full);
  ResponseList full;
  if (s.ok() && needs_full) {
    RequestList mine;
    mine.requests = std::move(uncached);
    mine.shutdown = shutdown_requested_.load();
    if (mine.shutdown) {
      std::lock_guard<std::mutex> lock(state_mu_);
      mine.failure = failure_;
      mine.relayed_stop = relayed_stop_;
      mine.relayed_failed_peer = failed_peer_;
    }
    s = state->negotiator.NegotiateFull(mine, &full);
  }
  if (!s.ok()) {
    Stop("negotiation failed: " + s.message(), /*report=*/true);
    return false;
  }

  // Marked before executing: completing a collective can let its caller stop
  // the timeline (or shut down) before this cycle ends.
  const size_t responses = cached_ready.size() + full.responses.size();
  // Every member runs the same working cycles, so all sample the same ones.
  const bool traced = responses > 0 && state->working_cycles++ % config_.timeline_sample_every == 0;
  if (responses > 0) state->executor.set_traced(traced);
  // Counted only for a reader: this runs every working cycle.
  if (responses > 0 && ((traced && timeline_->active()) || LogEnabled(LogLevel::kTrace))) {
    size_t tensors = 0;
    for (const Response& r : cached_ready) tensors += r.names.size();
    for (const Response& r : full.responses) tensors += r.names.size();
    if (traced) timeline_->MarkCycle(cycle_start, tensors);
    if (LogEnabled(LogLevel::kTrace)) {
      LogTrace("cycle runs " + std::to_string(responses) + " response(s) of " + std::to_string(tensors) +
               " tensor(s): " + std::to_string(cached_ready.size()) + " cached, " +
               std::to_string(full.responses.size()) + " negotiated");
    }
  }
  for (const Response& response : cached_ready) {
    if (!Execute(state, response, /*remember=*/false)) return false;
  }
  // Some rank changed these collectives: every rank forgets them.
  state->negotiator.Forget(full.evictions);
  for (const Response& response : full.responses) {
    if (LogEnabled(LogLevel::kDebug)) LogDebug("negotiated " + DescribeResponse(response));
    if (!Execute(state, response, /*remember=*/true)) return false;
  }
  if (responses > 0 && !full.shutdown && state->tuner && !state->tuner->finished()) {
    // Every member executed the same responses, so every one ends a sample here alike.
    const int64_t bytes = state->cycle_bytes;
    state->cycle_bytes = 0;
    if (state->tuner->CycleDone(bytes)) {
      Status tuned = SyncTuning(state);
      if (!tuned.ok()) {
        Stop("autotune failed: " + tuned.message(), /*report=*/true);
        return false;
      }
    }
  }
  if (full.shutdown) {
    if (full.shutdown_error.rfind("stall", 0) == 0) LogError(full.shutdown_error);
    if (full.failed_peer >= 0 && full.failed_peer != members_[transports_->topology().rank]) {
      std::lock_guard<std::mutex> lock(state_mu_);
      if (running_) failed_peer_ = full.failed_peer;  // an earlier Abort's peer stands
    }
    // A shutdown this rank asked for is no news to report.
    Stop(full.shutdown_error, /*report=*/!shutdown_requested_);
    return false;
  }
  return true;
}

}  // namespace smdist
