#include "data/data_path.h"

#include "common/error.h"
#include "device/device.h"

namespace spritetorch::data {

namespace {

int64_t dataset_bytes(const Dataset& d) {
  return static_cast<int64_t>(d.inputs.nbytes() + d.labels.nbytes());
}

}  // namespace

DataPath make_data_path(const Dataset& dataset, torch::Device device, LoaderOptions loader,
                        const DataPathOptions& path) {
  if (path.data_on != "auto" && path.data_on != "device" && path.data_on != "host")
    throw Error("unknown --data-on '" + path.data_on + "': expected auto, device or host");
  bool resident = path.data_on == "device";
  if (path.data_on == "auto") {
    // On the CPU the data is in host memory either way; resident skips the copies.
    const int64_t free = device.is_cpu() ? -1 : device::describe_device(device).free_memory;
    resident = device.is_cpu() || (free > 0 && dataset_bytes(dataset) <=
                                                   path.resident_share * static_cast<double>(free));
  }
  DataPath out;
  const DataPathOptions defaults;
  // --resident-share only weighs auto's choice against a device's free memory.
  const bool share_unused =
      path.resident_share != defaults.resident_share && (path.data_on != "auto" || device.is_cpu());
  const std::string share_note =
      share_unused ? "--resident-share unused: it weighs --data-on auto on a GPU" : "";
  if (resident) {
    out.loader = std::make_unique<ResidentLoader>(dataset, device, loader);
    out.description = "resident on " + device.str();
    // Streaming's options, set and unused: said where the run's settings are shown (not an
    // error: SPRITETORCH_WORKERS may set --workers for every run of a machine).
    std::string unused;
    for (const auto& [flag, set] :
         {std::pair<const char*, bool>{"--workers", path.workers != defaults.workers},
          {"--prefetch", path.prefetch != defaults.prefetch},
          {"--pin-memory", path.pin_memory != defaults.pin_memory}})
      if (set) unused += (unused.empty() ? "" : ", ") + std::string(flag);
    if (!unused.empty()) unused += " unused: streaming's, which --data-on host chooses";
    if (!share_note.empty()) unused += (unused.empty() ? "" : "; ") + share_note;
    if (!unused.empty()) out.description += " (" + unused + ")";
    return out;
  }
  StreamingOptions streaming;
  streaming.workers = path.workers;
  streaming.prefetch = path.prefetch;
  streaming.pin_memory = path.pin_memory < 0 ? device.is_cuda() : path.pin_memory != 0;
  streaming.pin_memory = streaming.pin_memory && device.is_cuda();
  out.loader = std::make_unique<StreamingLoader>(dataset, device, loader, streaming);
  out.description = "streaming: " + std::to_string(streaming.workers) + " workers, " +
                    (streaming.pin_memory ? "pinned, " : "") + "prefetch " +
                    std::to_string(std::max(1, streaming.prefetch));
  std::string unused = share_note;
  if (path.pin_memory == 1 && !device.is_cuda())
    unused += (unused.empty() ? "" : "; ") +
              std::string("--pin-memory unused: pinned buffers speed copies to a CUDA device");
  if (!unused.empty()) out.description += " (" + unused + ")";
  return out;
}

}  // namespace spritetorch::data
