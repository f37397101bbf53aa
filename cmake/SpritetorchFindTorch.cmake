# Finds LibTorch, in the order the user's intent goes:
#   1. whatever CMAKE_PREFIX_PATH / Torch_DIR point at (an unpacked LibTorch, a pip torch);
#   2. the pip torch of `python3`, if it imports and its cmake prefix exists
#      (Debian's python3-torch reports a prefix that does not exist: it is checked, not trusted);
#   3. Debian's libtorch-dev (1.13, CPU), found by plain find_package.
# Defines SPRITETORCH_WITH_CUDA (ON when the found LibTorch has CUDA) and SPRITETORCH_WITH_GLOO
# (ON when c10d's Gloo backend compiles and links).

find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  find_package(Python3 QUIET COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _st_pip_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _st_rc)
    if(_st_rc EQUAL 0 AND EXISTS "${_st_pip_prefix}/Torch/TorchConfig.cmake")
      message(STATUS "spritetorch: using the pip torch of ${Python3_EXECUTABLE}: ${_st_pip_prefix}")
      list(APPEND CMAKE_PREFIX_PATH "${_st_pip_prefix}")
      find_package(Torch QUIET CONFIG)
    endif()
  endif()
endif()
if(NOT Torch_FOUND)
  message(FATAL_ERROR "LibTorch not found. On Debian 12: apt-get install libtorch-dev "
                      "libopenblas0-pthread libgloo-dev (scripts/setup does it); or pass "
                      "-DCMAKE_PREFIX_PATH=<libtorch or torch.utils.cmake_prefix_path>.")
endif()

if(TARGET torch_cuda)
  set(SPRITETORCH_WITH_CUDA ON)
else()
  set(SPRITETORCH_WITH_CUDA OFF)
endif()
# Torch's own flags (ABI macro) go on every target through TORCH_LIBRARIES' interface; add CXX flags too.
# -fno-math-errno lets the compiler vectorise sqrt in the flat optimizer loops.
set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${TORCH_CXX_FLAGS} -fno-math-errno")
message(STATUS "spritetorch: LibTorch ${Torch_VERSION} at ${Torch_DIR}; CUDA: ${SPRITETORCH_WITH_CUDA}")

# torch.distributed's c10d with the Gloo backend (src/distributed/). The c10d headers ship with
# LibTorch, but ProcessGroupGloo.hpp includes gloo/... headers that Debian puts in libgloo-dev; a
# LibTorch built without distributed lacks the symbols. Without Gloo (and, in CUDA builds, without
# <nccl.h>) src/distributed/ compiles to a stub whose functions throw a clear error.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
set(CMAKE_REQUIRED_FLAGS "-std=c++17 ${TORCH_CXX_FLAGS}")
# The check links the library files, not TORCH_LIBRARIES' imported targets: a pip torch's targets
# name protobuf::libprotobuf, which a try_compile project cannot resolve (CMake 4 fails the whole
# configure on it). The symbols looked for live in torch_cpu; c10 is what it needs beside it.
find_library(SPRITETORCH_TORCH_CPU_LIBRARY torch_cpu HINTS "${TORCH_INSTALL_PREFIX}/lib")
find_library(SPRITETORCH_C10_LIBRARY c10 HINTS "${TORCH_INSTALL_PREFIX}/lib")
set(CMAKE_REQUIRED_LIBRARIES ${SPRITETORCH_TORCH_CPU_LIBRARY} ${SPRITETORCH_C10_LIBRARY} pthread)
check_cxx_source_compiles([=[
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
int main() {
  auto device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  c10d::TCPStoreOptions options;
  return device && options.port ? 0 : 1;
}
]=] SPRITETORCH_HAVE_C10D_GLOO)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LIBRARIES)
if(SPRITETORCH_HAVE_C10D_GLOO)
  set(SPRITETORCH_WITH_GLOO ON)
else()
  set(SPRITETORCH_WITH_GLOO OFF)
  message(STATUS "spritetorch: c10d Gloo not usable (on Debian: apt-get install libgloo-dev); "
                 "the Gloo backend is left out (CUDA builds may still use NCCL)")
endif()
message(STATUS "spritetorch: c10d Gloo: ${SPRITETORCH_WITH_GLOO}")
