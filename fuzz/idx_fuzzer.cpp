// Fuzzes the IDX reader on raw file bytes: plain IDX and gzip streams alike (gzread detects gzip).
#include "data/idx_reader.h"
#include "fuzz_util.h"
SPRITETORCH_FUZZ_PATH_READER(spritetorch::data::read_idx(path))
