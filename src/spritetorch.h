// spritetorch's public API in one include: <spritetorch/spritetorch.h>.
//   Train your own module:  train::ClassifierTask + train::Trainer (or a train::Task of your own)
//   Train from a config:    spritetorch::run_training(config) (what `spritetorch train` runs)
//   Weights for Python:     interop::python_state_dict, interop::write_safetensors
//   Weights from Python:    interop::read_safetensors, interop::load_state_dict (your module)
//   A model from Python:    TorchScript, ClassifierTask::builtin("script:FILE", ...)
//                           (models/script_model.h)
//   Stop a run with a checkpoint: train::request_interrupt (train/interrupt.h)
//   Activation checkpointing:    models::checkpointed, models::checkpointed_sequential
//                                (models/activation_checkpoint.h)
#pragma once

#include "common/error.h"
#include "common/notes.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "device/device.h"
#include "diffusion/generator.h"
#include "diffusion/generator_task.h"
#include "interop/python_state.h"
#include "interop/safetensors.h"
#include "models/activation_checkpoint.h"
#include "models/classifier.h"
#include "models/script_model.h"
#include "precision/precision.h"
#include "tasks/make_task.h"
#include "train/checkpoint.h"
#include "train/classifier_task.h"
#include "train/config.h"
#include "train/interrupt.h"
#include "train/model_state.h"
#include "train/task.h"
#include "train/trainer.h"
