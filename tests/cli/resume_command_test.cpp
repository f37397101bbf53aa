// The command printed after an interrupt, for a single process and for a launched rank.
#include "cli/resume_command.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace spritetorch::cli {
namespace {

std::string resume(std::vector<std::string> args, const std::string& checkpoint,
                   int local_world_size = 0, int nnodes = 1) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return resume_command(static_cast<int>(argv.size()), argv.data(), checkpoint, local_world_size,
                        nnodes);
}

TEST(ResumeCommand, RepeatsTheCommandLineWithTheCheckpoint) {
  EXPECT_EQ(resume({"spritetorch", "train", "--epochs", "10", "--save", "run.pt"}, "run.step5.pt"),
            "spritetorch train --epochs 10 --save run.pt --resume run.step5.pt");
  // An earlier --resume is replaced; arguments with spaces or quotes are quoted for a shell.
  EXPECT_EQ(
      resume({"spritetorch", "train", "--resume", "old.pt", "--save", "my run.pt"}, "it's.pt"),
      "spritetorch train --save 'my run.pt' --resume 'it'\\''s.pt'");
  EXPECT_EQ(resume({"spritetorch", "train", "--resume=old.pt"}, "new.pt"),
            "spritetorch train --resume new.pt");
}

// The interrupted run's --run-dir is not empty, so a resume that named it again would be refused.
TEST(ResumeCommand, LeavesOutTheInterruptedRunsFolder) {
  EXPECT_EQ(resume({"spritetorch", "train", "--run-dir", "r1", "--save", "i.pt"}, "i.step9.pt"),
            "spritetorch train --save i.pt --resume i.step9.pt");
  EXPECT_EQ(resume({"spritetorch", "train", "--run-dir=r1", "--epochs", "3"}, "c.pt"),
            "spritetorch train --epochs 3 --resume c.pt");
}

// A rank's own command line would start one process; the hint starts the ranks again.
TEST(ResumeCommand, ALaunchedRankIsResumedUnderLaunch) {
  EXPECT_EQ(resume({"/usr/bin/spritetorch", "train", "--bucket-mb", "10"}, "r.pt", 2),
            "/usr/bin/spritetorch launch --nproc-per-node 2 -- train --bucket-mb 10 --resume r.pt");
  EXPECT_EQ(resume({"spritetorch", "train"}, "r.pt", 4, 2),
            "spritetorch launch --nnodes 2 --nproc-per-node 4 -- train --resume r.pt");
}

}  // namespace
}  // namespace spritetorch::cli
