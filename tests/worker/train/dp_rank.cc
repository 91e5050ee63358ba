// One rank of data_parallel_test's multi-process group:
//   dp_rank <rank> <world_size> <rendezvous file> <output file>
// Joins the group through a c10d FileStore, trains its share of dp_case.h's batch, all-reduces
// the gradients and (rank 0) writes them to the output file as raw float32.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "tests/worker/train/dp_case.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: dp_rank <rank> <world_size> <rendezvous file> <output file>\n";
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int world = std::atoi(argv[2]);
  auto group = oomb::RankGroup::Join(oomb::Rendezvous::File(argv[3], world), rank, world, at::kCPU);
  if (!group.ok()) {
    std::cerr << "rank " << rank << ": " << group.status() << "\n";
    return 1;
  }
  oomb::testing::DpCase c = oomb::testing::MakeDpCase();
  const at::Tensor grads = oomb::testing::TrainShare(c, group->get());
  if (rank == 0) {
    std::ofstream out(argv[4], std::ios::binary);
    out.write(static_cast<const char*>(grads.data_ptr()), grads.numel() * static_cast<int64_t>(sizeof(float)));
  }
  return 0;
}
