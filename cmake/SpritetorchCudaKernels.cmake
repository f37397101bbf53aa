# spritetorch's own CUDA kernels (src/**/*.cu), in CUDA builds only. They are plain CUDA with C-like
# entry points (no LibTorch headers), compiled by nvcc into an object library of their own whose
# objects join the `spritetorch` library. Only their callers' files
# (SPRITETORCH_CUDA_KERNEL_CALLERS) see SPRITETORCH_WITH_CUDA_KERNELS=1, so turning the kernels off
# recompiles those files alone; other code asks at run time (group_norm_silu_cuda_kernel_built()).
#
# A kernel file that nvcc rejects must not cost a GPU machine its whole build: the files are first
# compiled and linked with CUDA's runtime into a test program at configure time (try_compile); when
# that fails they are left out with a warning naming the log, and the callers take LibTorch's ops.
# CPU builds never see the .cu files; tests/cuda/device_code_test.sh compiles them with clang there.
#   -DSPRITETORCH_CUDA_KERNELS=OFF        leave them out
#   -DCMAKE_CUDA_ARCHITECTURES="90"       the GPUs to compile for (default below)
option(SPRITETORCH_CUDA_KERNELS "Build spritetorch's own CUDA kernels in CUDA builds" ON)
set(SPRITETORCH_CUDA_KERNEL_CALLERS src/diffusion/group_norm_silu.cpp)
file(GLOB_RECURSE SPRITETORCH_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cu)
set(SPRITETORCH_CUDA_KERNELS_BUILT OFF)  # ON at the end: the tests check which copy they link
if(NOT SPRITETORCH_WITH_CUDA OR NOT SPRITETORCH_CUDA_KERNELS OR NOT SPRITETORCH_CUDA_SOURCES)
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(WARNING "spritetorch: no usable CUDA compiler (nvcc): its own CUDA kernels are left out "
                  "and LibTorch's ops run in their place")
  return()
endif()
# Turing to Hopper as machine code, plus Hopper's PTX for newer GPUs to compile when loaded (CUDA 13
# supports sm_75 and later). A launch on a GPU without code falls back to LibTorch's ops.
if(NOT CMAKE_CUDA_ARCHITECTURES)  # unset, or OFF as LibTorch's CMake files may leave it
  set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 86-real 89-real 90-real 90-virtual)
endif()
enable_language(CUDA)
find_package(CUDAToolkit QUIET)
if(NOT TARGET CUDA::cudart)
  message(WARNING "spritetorch: CUDA's runtime library (CUDA::cudart) not found: its own CUDA "
                  "kernels are left out")
  return()
endif()

set(_st_cuda_check_dir ${CMAKE_BINARY_DIR}/cuda-kernels-check)
file(WRITE ${_st_cuda_check_dir}/main.cu "int main() { return 0; }\n")
try_compile(SPRITETORCH_CUDA_KERNELS_COMPILE ${_st_cuda_check_dir}/build
  SOURCES ${_st_cuda_check_dir}/main.cu ${SPRITETORCH_CUDA_SOURCES}
  CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${CMAKE_CURRENT_SOURCE_DIR}/src"
              "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_STANDARD 17
  OUTPUT_VARIABLE _st_cuda_check_log)
if(NOT SPRITETORCH_CUDA_KERNELS_COMPILE)
  file(WRITE ${_st_cuda_check_dir}/failure.log "${_st_cuda_check_log}")
  message(WARNING "spritetorch: nvcc did not compile the project's CUDA kernels (log: "
                  "${_st_cuda_check_dir}/failure.log): they are left out and LibTorch's ops run "
                  "in their place")
  unset(SPRITETORCH_CUDA_KERNELS_COMPILE CACHE)  # try again at the next configure
  return()
endif()

add_library(spritetorch_cuda_kernels OBJECT ${SPRITETORCH_CUDA_SOURCES})
target_include_directories(spritetorch_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
set_target_properties(spritetorch_cuda_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                      POSITION_INDEPENDENT_CODE ON)
target_sources(spritetorch PRIVATE $<TARGET_OBJECTS:spritetorch_cuda_kernels>)
# The library was made before CUDA was enabled, so its architectures were not set from the default.
set_property(TARGET spritetorch PROPERTY CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})
# LibTorch's CUDA targets link the runtime too; named here for the build tree alone, so that the
# installed package's targets do not ask their users for CUDA::cudart.
target_link_libraries(spritetorch PUBLIC $<BUILD_INTERFACE:CUDA::cudart>)
set_property(SOURCE ${SPRITETORCH_CUDA_KERNEL_CALLERS} APPEND PROPERTY COMPILE_DEFINITIONS
             SPRITETORCH_WITH_CUDA_KERNELS=1)
set(SPRITETORCH_CUDA_KERNELS_BUILT ON)
message(STATUS "spritetorch: its own CUDA kernels for ${CMAKE_CUDA_ARCHITECTURES}")
