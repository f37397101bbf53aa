// One TrainObserver that forwards every event to several (progress printer, run recorder).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "train/trainer.h"

namespace spritetorch::runs {

class ObserverList : public train::TrainObserver {
 public:
  // nullptr entries are skipped (e.g. no run folder).
  explicit ObserverList(std::vector<train::TrainObserver*> observers) {
    for (auto* o : observers)
      if (o) observers_.push_back(o);
  }
  // Another observer, after those given at construction (nullptr: nothing).
  void add(train::TrainObserver* observer) {
    if (observer) observers_.push_back(observer);
  }
  void on_start(const std::string& device, const train::Settings& settings) override {
    for (auto* o : observers_) o->on_start(device, settings);
  }
  void on_step(const train::StepTick& tick) override {
    for (auto* o : observers_) o->on_step(tick);
  }
  void on_log(const train::StepLog& log) override {
    for (auto* o : observers_) o->on_log(log);
  }
  void on_epoch(const train::EpochReport& report) override {
    for (auto* o : observers_) o->on_epoch(report);
  }
  void on_eval(const train::EvalPoint& point, const train::StepTick& at) override {
    for (auto* o : observers_) o->on_eval(point, at);
  }
  void on_plan(const train::BudgetPlan& plan) override {
    for (auto* o : observers_) o->on_plan(plan);
  }
  void on_samples(int64_t epoch, const torch::Tensor& sprites, int64_t per_class) override {
    for (auto* o : observers_) o->on_samples(epoch, sprites, per_class);
  }

 private:
  std::vector<train::TrainObserver*> observers_;
};

}  // namespace spritetorch::runs
