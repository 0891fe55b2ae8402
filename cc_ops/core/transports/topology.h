// Where this process sits in the job: its rank among all ranks, among the
// ranks of its host (local) and among the hosts (cross).
#pragma once

namespace smdist {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool is_homogeneous = true;  // every host runs the same number of ranks
};

}  // namespace smdist
