// SIGINT / SIGTERM during training: checkpoint, exit 128+signal, and a resume whose final weights
// are bit-identical to an uninterrupted run's (CPU, fixed seed).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tasks/make_task.h"
#include "test_util.h"
#include "train/interrupt.h"
#include "train/run_state.h"
#include "train/trainer.h"

extern char** environ;

namespace spritetorch::train {
namespace {

using spritetorch::testing::ScratchDir;

void expect_same_weights(const std::string& a_path, const std::string& b_path) {
  const auto a = load_checkpoint(a_path), b = load_checkpoint(b_path);
  ASSERT_EQ(a.model.size(), b.model.size());
  for (const auto& [name, t] : a.model)
    EXPECT_TRUE(torch::equal(t, b.model.at(name))) << name << " differs after resume";
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (const auto& [name, t] : a.optimizer)
    EXPECT_TRUE(torch::equal(t, b.optimizer.at(name))) << "optimizer " << name << " differs";
}

// Calls request_interrupt(SIGTERM) once the log reports (epoch, step): deterministic stand-in for
// a signal, through the same flag the handler sets.
class InterruptAt : public TrainObserver {
 public:
  InterruptAt(int64_t epoch, int64_t step) : epoch_(epoch), step_(step) {}
  void on_log(const StepLog& log) override {
    if (log.epoch == epoch_ && log.step == step_) request_interrupt(SIGTERM);
  }

 private:
  int64_t epoch_, step_;
};

TrainConfig small_cnn_run(const ScratchDir& dir) {
  TrainConfig c;
  c.device = "cpu";
  c.model = "cnn";  // dropout: the global RNG state must survive the interruption
  c.train_limit = 320;
  c.test_limit = 64;
  c.epochs = 2;
  c.batch_size = 32;  // 10 steps per epoch
  c.log_every = 1;
  c.seed = 11;
  c.save = dir.file("full.pt");
  return c;
}

struct InterruptPoint {
  int64_t epoch, step;  // 1-based epoch, step within it after which the signal lands
};

class InterruptedRun : public ::testing::TestWithParam<InterruptPoint> {};

TEST_P(InterruptedRun, ResumeGivesBitIdenticalWeights) {
  SKIP_WITHOUT_FASHION_MNIST();
  ScratchDir dir;
  TrainConfig c = small_cnn_run(dir);
  const TrainReport straight = run_training(c);

  c.save = dir.file("cut.pt");
  InterruptAt interrupter(GetParam().epoch, GetParam().step);
  std::string checkpoint;
  try {
    run_training(c, &interrupter);
    FAIL() << "the run was not interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.exit_code(), 143);
    EXPECT_EQ(e.epoch(), GetParam().epoch);
    EXPECT_EQ(e.step(), GetParam().step);
    checkpoint = e.checkpoint();
  }
  const int64_t global = (GetParam().epoch - 1) * 10 + GetParam().step;
  EXPECT_EQ(checkpoint, dir.file("cut.step" + std::to_string(global) + ".pt"));

  c.resume = checkpoint;
  const TrainReport resumed = run_training(c);
  expect_same_weights(dir.file("full.pt"), dir.file("cut.pt"));
  // The running metrics were restored too: the last epoch's report is the same.
  EXPECT_EQ(resumed.epochs.back().loss, straight.epochs.back().loss);
  EXPECT_EQ(resumed.epochs.back().accuracy, straight.epochs.back().accuracy);
  EXPECT_EQ(resumed.test.accuracy, straight.test.accuracy);
}

INSTANTIATE_TEST_SUITE_P(Points, InterruptedRun,
                         ::testing::Values(InterruptPoint{1, 3}, InterruptPoint{1, 10},
                                           InterruptPoint{2, 7}),
                         [](const auto& info) {
                           return "Epoch" + std::to_string(info.param.epoch) + "Step" +
                                  std::to_string(info.param.step);
                         });

// Runs argv (argv[0] a path) with stdout+stderr into a pipe; returns its pid and the read end.
pid_t spawn(const std::vector<std::string>& args, int& out_fd) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  out_fd = fds[0];
  return pid;
}

// Reads `fd` to EOF, sending `signal` to `pid` once the output contains `trigger`.
std::string read_and_signal(int fd, pid_t pid, const std::string& trigger, int signal) {
  std::string out;
  bool sent = false;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
    if (!sent && out.find(trigger) != std::string::npos) {
      ::kill(pid, signal);
      sent = true;
    }
  }
  ::close(fd);
  return out;
}

int exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

std::vector<std::string> cnn_command(const ScratchDir& dir, const std::string& save) {
  return {SPRITETORCH_CLI_PATH, "train",  "--device",     "cpu", "--model",     "cnn",
          "--train-limit",      "960",    "--test-limit", "64",  "--epochs",    "2",
          "--batch-size",       "32",     "--seed",       "5",   "--log-every", "1",
          "--verbose",          "--save", dir.file(save)};
}

TEST(InterruptProcess, SigtermedTrainExits143AndItsResumeCommandReproducesTheWeights) {
  SKIP_WITHOUT_FASHION_MNIST();
  ScratchDir dir;
  int fd = -1;
  // The uninterrupted reference.
  pid_t pid = spawn(cnn_command(dir, "full.pt"), fd);
  ASSERT_GT(pid, 0);
  const std::string full_out = read_and_signal(fd, pid, "\x01never", 0);
  ASSERT_EQ(exit_code(pid), 0) << full_out;

  // SIGTERM from outside, once the run reports its 4th step (30 steps per epoch, 60 in all).
  pid = spawn(cnn_command(dir, "cut.pt"), fd);
  ASSERT_GT(pid, 0);
  const std::string out = read_and_signal(fd, pid, "epoch 1 step 4/30", SIGTERM);
  ASSERT_EQ(exit_code(pid), 143) << out;
  const auto at = out.find("resume with: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string command = out.substr(at + 13, out.find('\n', at) - at - 13);
  EXPECT_NE(command.find("--resume " + dir.file("cut.step")), std::string::npos) << command;
  EXPECT_NE(out.find("interrupted by SIGTERM at epoch"), std::string::npos) << out;

  // The printed command, run as printed, finishes the run.
  pid = spawn({"/bin/sh", "-c", command}, fd);
  ASSERT_GT(pid, 0);
  const std::string resumed_out = read_and_signal(fd, pid, "\x01never", 0);
  ASSERT_EQ(exit_code(pid), 0) << resumed_out;
  expect_same_weights(dir.file("full.pt"), dir.file("cut.pt"));
}

TEST(InterruptProcess, SigintExits130WithACheckpoint) {
  ScratchDir dir;
  int fd = -1;
  // Far more epochs than it will live through.
  const pid_t pid = spawn(
      {SPRITETORCH_CLI_PATH, "train", "--device", "cpu", "--model", "simplenn", "--dataset",
       "dummy", "--epochs", "100000", "--log-every", "1", "--verbose", "--save", dir.file("s.pt")},
      fd);
  ASSERT_GT(pid, 0);
  const std::string out = read_and_signal(fd, pid, "epoch 1 step 2/", SIGINT);
  ASSERT_EQ(exit_code(pid), 130) << out;
  EXPECT_NE(out.find("interrupted by SIGINT"), std::string::npos) << out;
  const auto saved = periodic_checkpoints(dir.file("s.pt"));
  ASSERT_EQ(saved.size(), 1u) << out;
  EXPECT_TRUE(load_checkpoint(saved[0]).meta.contains("run"));
  EXPECT_EQ(out.find("Exception raised from"), std::string::npos) << out;
}

// A process started with SIGINT ignored (a script's background job) keeps ignoring it: the run
// goes on to its end, as a shell's `train ... &` would expect.
TEST(InterruptProcess, ASigintIgnoredWhenTheRunStartedStaysIgnored) {
  ScratchDir dir;
  int fd = -1;
  const std::string train = std::string("exec '") + SPRITETORCH_CLI_PATH +
                            "' train --device cpu --model simplenn --dataset dummy --epochs 2 "
                            "--log-every 1 --verbose --no-run-dir --save '" +
                            dir.file("s.pt") + "'";
  const pid_t pid = spawn({"/bin/sh", "-c", "trap '' INT; " + train}, fd);
  ASSERT_GT(pid, 0);
  const std::string out = read_and_signal(fd, pid, "epoch 1 step 2/", SIGINT);
  ASSERT_EQ(exit_code(pid), 0) << out;
  EXPECT_EQ(out.find("interrupted"), std::string::npos) << out;
  EXPECT_NE(out.find("Epoch 2/2"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("s.pt")));
}

// --json: an interrupted run prints one JSON object saying where it stopped, the checkpoint and the
// command that goes on from it (the same command stderr prints), as a finished run prints its
// figures.
TEST(InterruptProcess, WithJsonPrintsTheCheckpointAndTheResumeCommand) {
  ScratchDir dir;
  int fd = -1;
  const pid_t pid = spawn({SPRITETORCH_CLI_PATH, "train", "--device", "cpu", "--model", "simplenn",
                           "--dataset", "dummy", "--epochs", "100000", "--log-every", "1",
                           "--verbose", "--no-run-dir", "--json", "--save", dir.file("j.pt")},
                          fd);
  ASSERT_GT(pid, 0);
  const std::string out = read_and_signal(fd, pid, "epoch 1 step 2/", SIGTERM);
  ASSERT_EQ(exit_code(pid), 143) << out;
  const auto at = out.find("{\"");
  ASSERT_NE(at, std::string::npos) << out;
  const auto json = nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
  EXPECT_EQ(json.at("interrupted"), true);
  EXPECT_EQ(json.at("signal"), "SIGTERM");
  EXPECT_EQ(json.at("exit_code"), 143);
  // Where it stopped: after the trigger, later under load (the signal is sent once read).
  EXPECT_GE(json.at("epoch").get<int64_t>(), 1);
  EXPECT_GE(json.at("step").get<int64_t>() + 64 * (json.at("epoch").get<int64_t>() - 1), 2);
  const auto saved = periodic_checkpoints(dir.file("j.pt"));
  ASSERT_EQ(saved.size(), 1u) << out;
  EXPECT_EQ(json.at("checkpoint"), saved[0]);
  const std::string resume = json.at("resume");
  EXPECT_NE(resume.find("--resume " + saved[0]), std::string::npos) << resume;
  EXPECT_NE(out.find("resume with: " + resume + "\n"), std::string::npos) << out;
  EXPECT_FALSE(json.contains("checkpoint_wanted"));
}

// A run stopped inside an epoch resumes only with the batches it was drawing: the same batch
// size, seed, --drop-last and class sampling (a checkpoint from before the option: natural).
// Fits running at once in two threads: the hooks (the CLI's signal handlers) are installed when the
// first loop starts and removed when the last ends, and the second loop's start does not clear a
// request the first has not taken yet. (Before, the first to end removed the other's handlers.)
int g_hook_starts = 0, g_hook_ends = 0;
TEST(LoopHooks, OverlappingLoopsCallThemOnceAndKeepAPendingRequest) {
  g_hook_starts = g_hook_ends = 0;
  set_loop_hooks({[] { ++g_hook_starts; }, [] { ++g_hook_ends; }});
  {
    std::optional<LoopScope> first(std::in_place);
    EXPECT_EQ(g_hook_starts, 1);
    EXPECT_TRUE(request_interrupt(SIGTERM));
    {
      LoopScope second;
      EXPECT_EQ(g_hook_starts, 1);
      EXPECT_EQ(interrupt_signal(), SIGTERM)
          << "a loop starting beside another cleared its request";
    }
    EXPECT_EQ(g_hook_ends, 0) << "the second loop's end removed the first's handlers";
    first.reset();
    EXPECT_EQ(g_hook_ends, 1);
  }
  {
    LoopScope alone;  // no loop runs: a stale request is cleared, the hooks run again
    EXPECT_EQ(interrupt_signal(), 0);
    EXPECT_EQ(g_hook_starts, 2);
  }
  EXPECT_EQ(g_hook_ends, 2);
  set_loop_hooks({});
}

TEST(MidEpochResume, RefusesOtherClassSampling) {
  Checkpoint checkpoint;
  checkpoint.meta = {
      {"batch_size", 64}, {"seed", 7}, {"drop_last", false}, {"class_sampling", "balanced"}};
  RunState state;
  state.epoch = 1;
  state.step = 3;
  TrainConfig config;
  config.batch_size = 64;
  config.seed = 7;
  config.resume = "gen.pt";
  config.class_sampling = data::ClassSampling::kBalanced;
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 1000));
  config.class_sampling = data::ClassSampling::kNatural;
  try {
    check_mid_run_resume(config, checkpoint, state, 1000);
    ADD_FAILURE() << "natural sampling resumed a balanced run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--class-sampling balanced"), std::string::npos)
        << e.what();
  }
  checkpoint.meta.erase("class_sampling");
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 1000));
  config.class_sampling = data::ClassSampling::kBalanced;
  EXPECT_THROW(check_mid_run_resume(config, checkpoint, state, 1000), Error);
}

// Another training set size (--train-limit) reorders the epoch: refused mid-epoch; a checkpoint
// from before the field passes.
TEST(MidEpochResume, RefusesAnotherTrainingSetSize) {
  Checkpoint checkpoint;
  checkpoint.meta = {{"batch_size", 64}, {"seed", 7}, {"drop_last", false}};
  RunState state;
  state.epoch = 0;
  state.step = 248;
  TrainConfig config;
  config.batch_size = 64;
  config.seed = 7;
  config.resume = "run.step248.pt";
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 19000));
  checkpoint.meta["train_samples"] = 20000;
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 20000));
  try {
    check_mid_run_resume(config, checkpoint, state, 19000);
    ADD_FAILURE() << "a smaller training set resumed mid-epoch";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a training set of 20000 samples; this run's has 19000"), std::string::npos)
        << what;
    EXPECT_NE(e.hint().find("--train-limit"), std::string::npos) << e.hint();
  }
}

// A step takes world_size x batch samples: a mid-epoch checkpoint of 2 ranks resumed as one
// process (or the other way round) would skip another number of samples. Refused, naming both;
// the same world size, and a checkpoint from before the field, pass.
TEST(MidEpochResume, RefusesAnotherWorldSize) {
  Checkpoint checkpoint;
  checkpoint.meta = {{"batch_size", 32}, {"seed", 7}, {"drop_last", false}};
  RunState state;
  state.epoch = 0;
  state.step = 30;
  TrainConfig config;
  config.batch_size = 32;
  config.seed = 7;
  config.resume = "run.step30.pt";
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 6000, 2));
  checkpoint.meta["world_size"] = 2;
  checkpoint.meta["local_shards"] = false;
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 6000, 2, false));
  try {
    check_mid_run_resume(config, checkpoint, state, 6000, 1);
    ADD_FAILURE() << "a 2-rank checkpoint resumed mid-epoch as one process";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("of a run of 2 ranks; this run has one process"), std::string::npos)
        << what;
    EXPECT_NE(e.hint().find("resume it with 2 ranks"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(check_mid_run_resume(config, checkpoint, state, 6000, 2, true), Error);
  checkpoint.meta["world_size"] = 1;
  try {
    check_mid_run_resume(config, checkpoint, state, 6000, 2);
    ADD_FAILURE() << "a single process's checkpoint resumed mid-epoch by 2 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("of a run of one process; this run has 2 ranks"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_mid_run_resume(config, checkpoint, state, 6000, 1, true));  // one process
}

// A classifier resumed on data of other classes (same count) would relabel its outputs: refused,
// naming both lists; the same names, or a checkpoint or data without names, pass.
TEST(ResumedClasses, OtherClassNamesAreRefused) {
  Checkpoint checkpoint;
  checkpoint.meta = {{"class_names", {"amulet", "book", "gem"}}};
  TrainConfig config;
  config.resume = "dc3.pt";
  config.dataset = "folder:dcx";
  EXPECT_NO_THROW(check_resumed_classes(config, checkpoint, {"amulet", "book", "gem"}));
  EXPECT_NO_THROW(check_resumed_classes(config, checkpoint, {}));
  try {
    check_resumed_classes(config, checkpoint, {"ring", "staff", "wand"});
    ADD_FAILURE() << "other classes accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("trained on the classes amulet, book, gem"), std::string::npos) << what;
    EXPECT_NE(what.find("(--dataset folder:dcx) has ring, staff, wand"), std::string::npos) << what;
  }
  checkpoint.meta.erase("class_names");
  EXPECT_NO_THROW(check_resumed_classes(config, checkpoint, {"ring", "staff", "wand"}));
}

}  // namespace
}  // namespace spritetorch::train
