// The process-wide collective engine: starts the communication runtime, owns
// one collective stream per process set (collective_stream.h; the set of all
// ranks is process set 0), the point-to-point channel and the timeline.
// Framework kernels only call Enqueue(); Python controls the lifetime and the
// process sets.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/shared_output_arena.h"
#include "common/status.h"
#include "common/tensor_entry.h"
#include "control/timeline.h"
#include "transports/point_to_point.h"
#include "transports/registry.h"

namespace smdist {

class CollectiveStream;

// Where this rank sits in a process set.
struct ProcessSetMembership {
  std::vector<int> ranks;  // the set's ranks, ascending
  int rank = -1;           // this rank's index among them, -1 when not a member
};

class Engine {
 public:
  static Engine& Instance();
  ~Engine();

  // Collective over all processes. Idempotent while running; restarts an
  // engine that another rank or a stall stopped.
  Status Init();
  // Stops the engine on every rank (the others learn it in the next cycle);
  // pending collectives fail. Init() may be called again afterwards.
  Status Shutdown();
  // Called by exit() (after Python's own exit handlers) with the exit status.
  // Status 0: shut down with every rank and finish the communication runtime,
  // which waits for the peers to finish. Otherwise this rank failed: it tells the peers why (so
  // their collectives fail at once, naming it) and leaves without waiting for
  // them, keeping its status; a launcher then stops the job.
  void AtProcessExit(int status);
  // The rank whose failure stopped this engine, or -1 (tells a rank that
  // fails afterwards it is not the cause).
  int failed_peer() const;
  // Stops the engine on every rank because this one failed: the others'
  // collectives fail with `failure`. Waits at most `wait_seconds` for the
  // announcement to go out; returns whether it did.
  bool AnnounceFailure(const std::string& failure, double wait_seconds);

  bool initialized() const { return initialized_.load(); }
  Topology topology() const;
  std::string intra_host_allreduce() const;
  // How long a negotiation round polls without pause before it yields, then sleeps (shorter
  // where ranks outnumber cores on some host); 0 before init.
  int64_t negotiation_busy_poll_us() const;
  // Whether the communication runtime lets several threads call it at once
  // (MPI_THREAD_MULTIPLE): point-to-point messages need it.
  bool runtime_threads_multiple() const { return runtime_threads_multiple_; }
  // Whether smdist_tf started the communication runtime; otherwise its owner
  // finishes it, perhaps before exit() runs AtProcessExit.
  bool owns_runtime() const;
  EngineConfig config() const;

  // Chrome-trace timeline of this rank (SMDIST_TIMELINE opens one at init),
  // with an instant event per cycle that ran collectives when `mark_cycles`.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline() { timeline_.Stop(); }

  // Process sets. Both are collective over every rank: each calls them for
  // the same set, in the same order; a disagreement (different ranks, order
  // or id), ranks out of range or repeated, a set that already exists, or
  // (Remove) collectives in flight on the set fails on every rank alike.
  // `ranks`: any order; the set's id goes to *id (the lowest free one, from 1).
  Status AddProcessSet(std::vector<int> ranks, int32_t* id);
  Status RemoveProcessSet(int32_t id);
  // The registered sets' ids, 0 first.
  std::vector<int32_t> ProcessSetIds() const;
  // The set's ranks and this rank's place in it; an error for an unknown id,
  // and with `require_member` for a set this rank is not in.
  Status Membership(int32_t process_set_id, ProcessSetMembership* out, bool require_member = false) const;

  // Queues entries submitted together (they are negotiated in the same
  // cycle, so a group fuses) on their process set's stream (all entries of a
  // group belong to one set). On error nothing is queued and no done runs:
  // an unknown set, or one this rank is not a member of, is an error.
  // With `run_inline`, a caller that finds no cycle running runs one itself
  // instead of waking the engine thread: a lone collective then completes
  // without two thread hand-offs (done may run before Enqueue returns).
  Status Enqueue(std::vector<TensorEntry> entries, bool run_inline = false);

  // Point-to-point messages (pipeline parallelism). They bypass negotiation:
  // both ends name each other, and a send never waits for its receiver.
  Status Send(SendMessage message);
  Status Recv(RecvMessage message);

  // Memory for an allreduce output that this host's peers can store into
  // directly (SharedOutputArena), or null: no arena, not running, or full.
  // Any thread; the block may outlive the engine.
  std::unique_ptr<SharedOutputBlock> AllocateSharedOutput(int64_t bytes);
  int64_t shared_output_bytes_in_use() const;
  // The response cache's names, most recently executed first (tests). An
  // error once the engine stopped (a peer's shutdown() stops it here too):
  // an empty list would read as a cache that disagrees with the peers'.
  Status CachedNames(std::vector<std::string>* out);
  // Negotiation cycles the global set has run so far, idle ones included (tests:
  // an idle engine must negotiate ever less often).
  Status CyclesRun(uint64_t* out);
  // How an allreduce of host tensors of these element counts would run here
  // now: one "<transport> in_place|packed <member>,..." line per step of the
  // fusion planner's plan (tests). Empty when not running.
  std::vector<std::string> DescribeAllreducePlan(const std::vector<int64_t>& counts, DataType dtype,
                                                 WireCompression compression, double prescale);

 private:
  Engine() = default;
  // Why a send/recv cannot be taken now, or OK; state_mu_ held.
  Status PointToPointReadyLocked() const;
  // Stops every stream and frees the transports; lifecycle_mu_ held.
  void ReleaseLocked();
  // The stream of process set `id` on this rank, or an error saying why none.
  Status StreamOf(int32_t id, std::shared_ptr<CollectiveStream>* out) const;
  // Why this rank may not use registered set `id` of `ranks`; state_mu_ held.
  Status NotAMemberLocked(int32_t id, const std::vector<int>& ranks) const;
  // Process set 0 stopped by itself (a failure, a peer's, a stall): every
  // other stream and the point-to-point channel stop too.
  void OnGlobalStop(const std::string& reason);

  mutable std::mutex lifecycle_mu_;  // Init/Shutdown/AddProcessSet/RemoveProcessSet; config_
  // Guards running_ through process_sets_, world_transports_ and p2p_;
  // held briefly (never across communication), after lifecycle_mu_ when both are.
  mutable std::mutex state_mu_;
  std::atomic<bool> initialized_{false};
  bool running_ = false;
  std::string stop_reason_;
  int failed_peer_ = -1;
  Topology topology_;  // of all ranks
  std::map<int32_t, std::shared_ptr<CollectiveStream>> streams_;  // the sets this rank is in
  std::map<int32_t, std::vector<int>> process_sets_;  // every registered set's ranks
  // At process exit the framework may be half torn down: pending entries are
  // dropped instead of completed.
  std::atomic<bool> exiting_{false};
  bool runtime_threads_multiple_ = false;

  EngineConfig config_;
  const Transports* world_transports_ = nullptr;  // process set 0's, for registration
  PointToPointChannel* p2p_ = nullptr;  // world's; null without runtime_threads_multiple_
  mutable std::mutex arena_mu_;  // output_arena_ vs kernels on TensorFlow's threads
  std::shared_ptr<SharedOutputArena> output_arena_;
  Timeline timeline_;
};

}  // namespace smdist
