// Faults during training and while saving: divergence, out-of-memory, the overwrite rule,
// --keep-last, and a process killed in the middle of writing a checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/output_file.h"
#include "tasks/make_task.h"
#include "test_util.h"
#include "train/interrupt.h"
#include "train/run_state.h"
#include "train/trainer.h"

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

TrainConfig dummy_run(const ScratchDir& dir) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "simplenn";
  c.dataset = "dummy";  // 4096 samples: 64 steps of 64 per epoch
  c.epochs = 1;
  c.save = dir.file("run.pt");
  return c;
}

std::string error_of(const TrainConfig& c) {
  try {
    run_training(c);
  } catch (const Error& e) {
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "";
}

TEST(Divergence, NanWeightsStopTheRunAndTheCheckpointBeforeIsNamedAsSuspect) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.optimizer = "sgd";
  c.lr = 1e37;  // the first update makes the weights huge, the second inf
  c.log_every = 4;
  c.checkpoint_every = 1;
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("training diverged: weights are not finite in epoch 1, at or before step 2"),
            std::string::npos)
      << msg;
  // Step 1's checkpoint was written while the losses were finite, but its weights' loss (step 2's)
  // is not: it is kept and named as suspect, never as good; step 2's never was written.
  const std::string suspect = periodic_checkpoint_path(c.save, 1);
  EXPECT_EQ(msg.find("last good checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no checkpoint was known good before it; " + suspect +
                     " was written after the last finite loss"),
            std::string::npos)
      << msg;
  EXPECT_EQ(periodic_checkpoints(c.save), std::vector<std::string>{suspect});
  EXPECT_FALSE(std::filesystem::exists(c.save));
}

// The checkpoint a divergence names as good is one that trains on: kept by --keep-last 1 (beside a
// newer suspect one, when the loss found the divergence), and resumable at a lower lr. Which
// check sees it first (the loss of step N, or the weights at step N's checkpoint) and at which
// step depends on the CPU's rounding, so the test reads both from the message.
TEST(Divergence, TheLastGoodCheckpointNamedResumesAtALowerLr) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.optimizer = "sgd";
  c.lr = 1e4;  // diverges within a few steps (at step 7, by its loss, on Zen 5)
  c.log_every = 1;
  c.checkpoint_every = 1;
  c.keep_last = 1;
  const std::string msg = error_of(c);
  ASSERT_EQ(msg.rfind("training diverged: ", 0), 0u) << msg;
  const std::string good_head = "last good checkpoint: ";
  const size_t at = msg.find(good_head);
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string good =
      msg.substr(at + good_head.size(), msg.find(" (--resume it)", at) - at - good_head.size());
  const auto kept = periodic_checkpoints(c.save);
  EXPECT_NE(std::find(kept.begin(), kept.end(), good), kept.end()) << msg;
  EXPECT_LE(kept.size(), 2u);  // --keep-last 1, and the good one while a newer one is unconfirmed
  if (msg.find("was written after the last finite loss") != std::string::npos) {
    ASSERT_EQ(kept, (std::vector<std::string>{good, kept.back()})) << msg;
    EXPECT_NE(msg.find("; " + kept.back() + " was written after the last finite loss"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(c.save));

  TrainConfig again = c;
  again.resume = good;
  again.lr = 0.01;
  again.checkpoint_every = 0;
  again.keep_last = 0;
  EXPECT_EQ(error_of(again), "");
  EXPECT_TRUE(std::filesystem::exists(c.save));
}

// The update after the last loss can be the one that blows up: the final evaluation sees it, and
// no model is saved (an --overwrite'n good one stays as it was).
TEST(Divergence, TheLastUpdateBlowingUpSavesNothingAndKeepsTheFileOverwriteWouldReplace) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.train_limit = 64;  // one step: its loss is the initial weights'
  run_training(c);
  std::ifstream in(c.save, std::ios::binary);
  const std::string before{std::istreambuf_iterator<char>(in), {}};
  TrainConfig wild = c;
  wild.optimizer = "sgd";
  wild.lr = 1e30;
  wild.overwrite = true;
  const std::string msg = error_of(wild);
  EXPECT_TRUE(msg.find("training diverged: the test set's loss is nan") != std::string::npos ||
              msg.find("training diverged: weights are not finite in epoch 1, after its last "
                       "step (1)") != std::string::npos)
      << msg;
  std::ifstream after_in(c.save, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(after_in), {}), before);
}

// A run resumed from a good checkpoint names it when it diverges before a checkpoint of its own.
TEST(Divergence, AResumedRunNamesTheCheckpointItResumedFrom) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  run_training(c);
  TrainConfig wild = c;
  wild.resume = c.save;
  wild.save = dir.file("wild.pt");
  wild.epochs = 2;
  wild.lr = 1e30;
  const std::string msg = error_of(wild);
  EXPECT_NE(msg.find("training diverged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the last good state is the checkpoint this run resumed from: " + c.save),
            std::string::npos)
      << msg;
}

TEST(Divergence, DetectedAtTheLogIntervalWithoutPeriodicCheckpoints) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.optimizer = "sgd";
  c.lr = 1e37;
  c.log_every = 5;
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("loss is nan in epoch 1, steps 1-5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no checkpoint was written"), std::string::npos) << msg;
}

TEST(OutOfMemory, ReportsStepAndHintAndSavesTheRunState) {
  // The training loop hands a caught c10::OutOfMemoryError to out_of_memory(); on the CPU no such
  // error can be provoked, so the message and the save are checked here directly.
  const c10::OutOfMemoryError oom({__func__, __FILE__, __LINE__},
                                  "CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail");
  TrainConfig c;
  c.device = "cuda:0";
  c.batch_size = 4096;
  const Error e = out_of_memory(oom, c, 2, 9, [] { return std::string("run.step137.pt"); });
  const std::string msg = e.what();
  EXPECT_NE(msg.find("out of device memory in epoch 3, step 10 (batch 4096 on cuda:0)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Tried to allocate 2.00 GiB; run state saved to run.step137.pt"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("more detail"), std::string::npos) << "only the first line of LibTorch's text";
  EXPECT_NE(e.hint().find("smaller --batch-size"), std::string::npos);
  EXPECT_NE(e.hint().find("bf16"), std::string::npos);
  EXPECT_NE(e.hint().find("streaming"), std::string::npos);
  const Error unsaved =
      out_of_memory(oom, c, 0, 0, []() -> std::string { throw Error("disk full"); });
  EXPECT_NE(std::string(unsaved.what()).find("could not be saved: disk full"), std::string::npos);
}

TEST(Overwrite, SaveRefusesAnExistingFileUnlessOverwriteOrResumingInPlace) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  run_training(c);
  const auto before = std::filesystem::last_write_time(c.save);
  std::string msg = error_of(c);
  EXPECT_NE(msg.find("refusing to overwrite " + c.save), std::string::npos) << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  EXPECT_EQ(std::filesystem::last_write_time(c.save), before);

  c.overwrite = true;
  EXPECT_EQ(error_of(c), "");
  c.overwrite = false;
  c.resume = c.save;  // resuming in place
  c.epochs = 2;
  EXPECT_EQ(error_of(c), "");

  // check_new_output is the rule other commands use.
  EXPECT_THROW(check_new_output(c.save, false, "--out"), Error);
  EXPECT_NO_THROW(check_new_output(c.save, true, "--out"));
  EXPECT_NO_THROW(check_new_output(dir.file("new.png"), false, "--out"));

  // check_output_path adds the folder: it must exist, and the path must not be one.
  EXPECT_NO_THROW(check_output_path(dir.file("new.png"), false, "--out"));
  EXPECT_NO_THROW(check_output_path("relative-new.png", false, "--out"));  // the current folder
  EXPECT_THROW(check_output_path(c.save, false, "--out"), Error);
  try {
    check_output_path(dir.file("missing/new.png"), false, "--out");
    ADD_FAILURE() << "a missing folder was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot write " + dir.file("missing/new.png") +
                                         " (given as --out): the folder " + dir.file("missing") +
                                         " does not exist");
  }
  EXPECT_THROW(check_output_path(dir.file(""), true, "--out"),
               Error);  // a folder, even with overwrite
}

TEST(Overwrite, AFreshRunDoesNotTakeOverAnotherRunsPeriodicCheckpoints) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.checkpoint_every = 32;
  c.save = dir.file("a.pt");
  run_training(c);
  c.save = dir.file("b.pt");  // periodic files of a.pt stay a.pt's
  run_training(c);
  std::filesystem::remove(dir.file("b.pt"));
  const std::string msg = error_of(c);  // b.step32.pt, b.step64.pt exist; no --resume
  EXPECT_NE(msg.find("checkpoints of another run: " + dir.file("b.step64.pt")), std::string::npos)
      << msg;
  c.resume = dir.file("b.step32.pt");  // continuing that run is fine
  EXPECT_EQ(error_of(c), "");
}

// A run that writes no periodic checkpoints may start beside another run's (a stray file must not
// block every later run in the folder); stopped, its one checkpoint takes a name no file has.
TEST(Overwrite, ARunWithoutPeriodicCheckpointsStartsBesideAnotherRunsAndTakesNoneOfTheirNames) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.checkpoint_every = 32;
  c.save = dir.file("a.pt");
  run_training(c);
  std::filesystem::remove(dir.file("a.pt"));
  c.checkpoint_every = 0;
  EXPECT_EQ(error_of(c), "");  // a.step32.pt and later exist; this run writes a.pt only
  EXPECT_EQ(unused_checkpoint_path(periodic_checkpoint_path(c.save, 32)),
            dir.file("a.step32-2.pt"));
  EXPECT_EQ(unused_checkpoint_path(dir.file("free.pt")), dir.file("free.pt"));
  c.keep_last = 1;  // pruning would be among another run's files
  std::filesystem::remove(dir.file("a.pt"));
  EXPECT_NE(error_of(c).find("checkpoints of another run"), std::string::npos);
}

// TMPDIR for one scope: where rescue_path puts a checkpoint a full disk refused.
class TempFolder {
 public:
  explicit TempFolder(const std::string& dir) {
    if (const char* old = std::getenv("TMPDIR")) old_ = old;
    std::filesystem::create_directories(dir);
    ::setenv("TMPDIR", dir.c_str(), 1);
  }
  ~TempFolder() {
    if (old_)
      ::setenv("TMPDIR", old_->c_str(), 1);
    else
      ::unsetenv("TMPDIR");
  }

 private:
  std::optional<std::string> old_;
};

// write_file_atomically(path) of this process fails with ENOSPC: its temporary is /dev/full.
void fill_disk_for(const std::string& path) {
  const std::filesystem::path target(path);
  std::filesystem::create_symlink(
      "/dev/full", target.parent_path() /
                       ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid())));
}

class StopAfterStep : public TrainObserver {
 public:
  explicit StopAfterStep(int64_t step) : step_(step) {}
  void on_step(const StepTick& tick) override {
    if (tick.epoch == 1 && tick.step == step_) request_interrupt(SIGINT);
  }

 private:
  int64_t step_;
};

// Two runs given one --save (without --overwrite) both passed the check at the start; the one that
// ends second must not replace the other's model: its own goes to the temp folder, and both stay.
TEST(SaveRace, ASaveFileMadeWhileTheRunTrainedIsKeptAndTheModelGoesToTheTempFolder) {
  ScratchDir dir;
  TempFolder tmp(dir.file("tmp"));
  TrainConfig c = dummy_run(dir);
  struct OtherRunSaves : TrainObserver {
    std::string save;
    void on_epoch(const EpochReport&) override { std::ofstream(save) << "the other run's model"; }
  } other;
  other.save = c.save;
  std::string message, hint;
  try {
    run_training(c, &other);
  } catch (const IncompleteRun& e) {
    message = e.what();
    hint = e.hint();
  }
  const std::string rescue = dir.file("tmp/spritetorch-run-" + std::to_string(::getpid()) + ".pt");
  EXPECT_NE(message.find("another process made it"), std::string::npos) << message;
  EXPECT_NE(message.find("saved to " + rescue + " instead"), std::string::npos) << message;
  EXPECT_EQ(load_checkpoint(rescue).meta["steps"], 64);
  std::ifstream theirs(c.save);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(theirs), {}), "the other run's model");
  // With --overwrite the run's model replaces it, as asked.
  c.overwrite = true;
  run_training(c, &other);
  EXPECT_EQ(load_checkpoint(c.save).meta["steps"], 64);
}

// An interrupted run whose checkpoint does not fit goes to the temp folder, as a final --save's
// does: Interrupted names both places and the reason, exits 1, and the run resumes from it.
TEST(FullDisk, AnInterruptCheckpointThatCannotBeWrittenGoesToTheTempFolder) {
  ScratchDir dir;
  TempFolder tmp(dir.file("tmp"));
  TrainConfig c = dummy_run(dir);
  fill_disk_for(dir.file("run.step5.pt"));
  StopAfterStep stop(5);
  std::string rescued;
  try {
    run_training(c, &stop);
    FAIL() << "the run was not interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.wanted(), dir.file("run.step5.pt"));
    EXPECT_EQ(e.why(), "cannot write " + dir.file("run.step5.pt") + ": No space left on device");
    EXPECT_EQ(e.exit_code(), 1);
    rescued = e.checkpoint();
  }
  EXPECT_EQ(std::filesystem::path(rescued).parent_path(), std::filesystem::path(dir.file("tmp")));
  EXPECT_EQ(load_checkpoint(rescued).meta["steps"], 5);
  EXPECT_FALSE(std::filesystem::exists(dir.file("run.step5.pt")));
  c.resume = rescued;
  run_training(c);
  EXPECT_TRUE(std::filesystem::exists(c.save));
}

// A periodic checkpoint that does not fit stops the run with its state in the temp folder; when
// that fails too, the error names the newest checkpoint that was written.
TEST(FullDisk, APeriodicCheckpointThatCannotBeWrittenStopsTheRunWithItsStateSafe) {
  ScratchDir dir;
  TempFolder tmp(dir.file("tmp"));
  TrainConfig c = dummy_run(dir);
  c.checkpoint_every = 16;
  fill_disk_for(dir.file("run.step32.pt"));
  std::string message, hint;
  try {
    run_training(c);
  } catch (const IncompleteRun& e) {
    message = e.what();
    hint = e.hint();
  }
  const std::string rescue =
      dir.file("tmp/spritetorch-run.step32-" + std::to_string(::getpid()) + ".pt");
  EXPECT_EQ(message, "cannot write " + dir.file("run.step32.pt") +
                         ": No space left on device; the run stopped at epoch 1, step 32 and its "
                         "state was saved to " +
                         rescue + " instead");
  EXPECT_NE(hint.find("mv " + rescue + " " + dir.file("run.step32.pt")), std::string::npos) << hint;
  EXPECT_EQ(load_checkpoint(rescue).meta["steps"], 32);
  EXPECT_TRUE(std::filesystem::exists(dir.file("run.step16.pt")));
  EXPECT_FALSE(std::filesystem::exists(c.save));

  std::filesystem::remove(rescue);
  for (const auto& f : {"run.step16.pt"}) std::filesystem::remove(dir.file(f));
  fill_disk_for(dir.file("run.step32.pt"));
  fill_disk_for(rescue);
  c.overwrite = true;
  try {
    run_training(c);
    FAIL() << "the run went on";
  } catch (const IncompleteRun& e) {
    EXPECT_NE(std::string(e.what()).find("could not be saved to " + rescue + " either"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.hint(),
              "the newest checkpoint written: " + dir.file("run.step16.pt") + " (--resume it)");
  }
}

// A run killed while it saved a periodic checkpoint left ".run.step<N>.pt.tmp-<pid>": no later
// save has that name, so the next run of the same --save removes it (and only such files of dead
// writers) at its first periodic save.
TEST(KeepLast, TheFirstPeriodicSaveRemovesTheTemporariesAKilledRunLeft) {
  ScratchDir dir;
  const pid_t child = testing::pid_of_a_finished_process();
  ASSERT_GT(child, 0);
  const std::string gone = std::to_string(child);
  const std::string live = std::to_string(::getppid());
  const std::vector<std::string> removed = {dir.file(".run.step774.pt.tmp-" + gone),
                                            dir.file(".run.step775.pt.tmp-" + gone + "-4242")};
  const std::vector<std::string> kept = {
      dir.file(".run.step776.pt.tmp-" + live),    // a live writer's
      dir.file(".other.step774.pt.tmp-" + gone),  // another --save's
      dir.file(".run.stepX.pt.tmp-" + gone),      // not a periodic name
      dir.file(".run.step774.pt.tmp-abc")};       // not ours
  for (const auto& f : removed) std::ofstream(f) << "half a checkpoint";
  for (const auto& f : kept) std::ofstream(f) << "half a checkpoint";
  TrainConfig c = dummy_run(dir);
  c.checkpoint_every = 32;
  c.keep_last = 1;
  run_training(c);
  for (const auto& f : removed) EXPECT_FALSE(std::filesystem::exists(f)) << f;
  for (const auto& f : kept) EXPECT_TRUE(std::filesystem::exists(f)) << f;
  EXPECT_EQ(periodic_checkpoints(c.save), std::vector<std::string>{dir.file("run.step64.pt")});
}

TEST(KeepLast, KeepsOnlyTheNewestPeriodicCheckpoints) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.epochs = 2;
  c.checkpoint_every = 10;
  c.keep_last = 3;
  run_training(c);
  const auto kept = periodic_checkpoints(c.save);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0], periodic_checkpoint_path(c.save, 100));
  EXPECT_EQ(kept[2], periodic_checkpoint_path(c.save, 120));
  EXPECT_TRUE(std::filesystem::exists(c.save));  // the final checkpoint is not a periodic one
  // An unrelated file with a similar name is never touched.
  std::ofstream(dir.file("run.stepX.pt")) << "x";
  prune_periodic_checkpoints(c.save, 1, 120);
  EXPECT_EQ(periodic_checkpoints(c.save).size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir.file("run.stepX.pt")));
}

// A shorter run over the same --save (--overwrite) keeps its own newest checkpoints; the files of
// the longer run before it, past its last step, are not ranked with them.
TEST(KeepLast, AnotherRunsLaterCheckpointsDoNotCountAsThisRunsNewest) {
  ScratchDir dir;
  TrainConfig c = dummy_run(dir);
  c.epochs = 2;
  c.checkpoint_every = 10;
  c.keep_last = 2;
  run_training(c);  // leaves step 110 and 120
  c.epochs = 1;
  c.keep_last = 1;
  c.overwrite = true;
  run_training(c);  // steps 10 .. 60
  const auto kept = periodic_checkpoints(c.save);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0], periodic_checkpoint_path(c.save, 60));
  EXPECT_EQ(kept[1], periodic_checkpoint_path(c.save, 110));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TornWrite, AProcessKilledWhileSavingLeavesTheOldOrTheNewFileNeverATornOne) {
  ScratchDir dir;
  const std::string path = dir.file("big.pt");
  // Two 24 MiB versions that differ in every byte; a torn file would mix them or be short.
  const std::string a(24 << 20, 'a'), b(24 << 20, 'b');
  write_file_atomically(path, a);
  int torn_windows = 0;  // kills that landed while a temporary file was being written
  for (int round = 0; round < 12; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // writes the two versions in turn until killed
      for (int i = 0;; ++i) write_file_atomically(path, i % 2 ? a : b);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 37 * round % 150));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    const std::string now = read_file(path);
    ASSERT_TRUE(now == a || now == b) << "round " << round << ": " << now.size() << " bytes, torn";
    for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
      if (entry.path().filename().string().rfind(".big.pt.tmp-", 0) == 0) {
        ++torn_windows;
        std::filesystem::remove(entry.path());  // what the dead writer left
      }
  }
  // The test means something only if some kills hit the middle of a write.
  EXPECT_GT(torn_windows, 0);
}

}  // namespace
}  // namespace spritetorch::train
