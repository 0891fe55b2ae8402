#include "transports/mpi/mpi_control_plane.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "transports/mpi/mpi_collectives.h"
#include "transports/mpi/mpi_types.h"

namespace smdist {

namespace {

// The first sleep between polls, doubled after each up to the longest, which bounds what a
// sleep adds to a round once the late peer arrives.
constexpr auto kFirstSleep = std::chrono::microseconds(20);
constexpr auto kLongestSleep = std::chrono::microseconds(250);
// The rounds after one that outlasted the polls and yields, with brief_while_late, poll
// only this long, then sleep: a cycle's first round waits for the late peer, the next ones
// find it there.
constexpr int kBriefRoundsAfterLatePeer = 8;
constexpr auto kBriefPoll = std::chrono::microseconds(100);
// So does a round that starts this long after the last one ended: it comes from a rank that
// was idle (its engine negotiates now and then) or paused, and no step of its own waits on it.
constexpr auto kPauseBeforeIdleRound = std::chrono::milliseconds(5);

}  // namespace

// A peer may be a whole step behind, and polling all that time takes a core from
// the ranks still computing (TensorFlow's threads, or the very peer being waited
// for): after the busy polls and the yields, sleep ever longer between polls.
Status MpiControlPlane::Wait(MPI_Request* request, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const bool brief = wait_.brief_while_late &&
                     (brief_rounds_left_ > 0 || start - last_round_end_ > kPauseBeforeIdleRound);
  const auto busy = brief ? kBriefPoll : wait_.busy_poll;
  const auto yield_until = brief ? kBriefPoll : wait_.yield_until;
  auto sleep = kFirstSleep;
  while (true) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError(rc, what);
    const auto waited = std::chrono::steady_clock::now() - start;
    if (done) {
      last_round_end_ = start + waited;
      if (waited >= wait_.yield_until) {
        brief_rounds_left_ = kBriefRoundsAfterLatePeer;
      } else if (brief_rounds_left_ > 0) {
        --brief_rounds_left_;
      }
      return Status::OK();
    }
    if (waited < busy) continue;
    if (waited < yield_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kLongestSleep);
    }
  }
}

Status MpiControlPlane::Round(const char* what, const std::function<int(MPI_Request*)>& start) {
  MPI_Request request;
  const int rc = start(&request);
  if (rc != MPI_SUCCESS) return MpiError(rc, what);
  return Wait(&request, what);
}

Status MpiControlPlane::GatherToRoot(const std::vector<uint8_t>& mine,
                                     std::vector<std::vector<uint8_t>>* gathered) {
  const Topology& topo = comms_->topology();
  const int n = topo.size;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(topo.rank == 0 ? n : 0);
  MPI_Comm world = comms_->world();
  // The root waits here for the last rank to reach this round; the payload follows at once.
  SMDIST_RETURN_IF_ERROR(Round("MPI_Gather", [&](MPI_Request* r) {
    return MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, world, r);
  }));
  std::vector<int> displs;
  std::vector<uint8_t> all;
  if (topo.rank == 0) {
    displs.resize(n);
    int total = 0;
    for (int r = 0; r < n; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  const int rc = MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0,
                             world);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Gatherv");
  if (topo.rank == 0) {
    gathered->assign(n, {});
    for (int r = 0; r < n; ++r) {
      (*gathered)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    }
  }
  return Status::OK();
}

Status MpiControlPlane::BroadcastFromRoot(std::vector<uint8_t>* bytes) {
  int64_t size = static_cast<int64_t>(bytes->size());
  MPI_Comm world = comms_->world();
  // The other ranks wait here for the root's answer; the payload follows at once.
  SMDIST_RETURN_IF_ERROR(
      Round("MPI_Bcast", [&](MPI_Request* r) { return MPI_Ibcast(&size, 1, MPI_INT64_T, 0, world, r); }));
  bytes->resize(size);
  return MpiBroadcast(world, bytes->data(), size, DataType::kUInt8, 0);
}

Status MpiControlPlane::AllreduceBits(std::vector<uint64_t>* words, bool bitwise_and) {
  const int count = static_cast<int>(words->size());
  const MPI_Op op = bitwise_and ? MPI_BAND : MPI_BOR;
  MPI_Comm world = comms_->world();
  return Round("MPI_Allreduce(bits)", [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, words->data(), count, MPI_UINT64_T, op, world, r);
  });
}

}  // namespace smdist
