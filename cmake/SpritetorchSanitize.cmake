# Sanitizer and fuzzing builds (docs/reliability.md). Each goes in its own build folder:
#   cmake -B build-asan -DCMAKE_CXX_COMPILER=clang++-14 -DSPRITETORCH_SANITIZE=address,undefined
#   cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DSPRITETORCH_FUZZ=ON
# The flags apply to every target of this project (compile and link) so that the one shared
# precompiled header keeps matching flags. LibTorch itself is not instrumented.
set(SPRITETORCH_SANITIZE "" CACHE STRING
    "Sanitizers for every target, passed to -fsanitize= (e.g. address,undefined); empty: none")
option(SPRITETORCH_FUZZ "Build the libFuzzer targets in fuzz/ (clang only; adds address,undefined)" OFF)

if(SPRITETORCH_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SPRITETORCH_FUZZ needs clang (libFuzzer): configure a fresh build folder "
                        "with -DCMAKE_CXX_COMPILER=clang++-14 (Debian: clang-14 libclang-rt-14-dev)")
  endif()
  if(NOT SPRITETORCH_SANITIZE)
    set(SPRITETORCH_SANITIZE "address,undefined")
  endif()
  # Coverage instrumentation everywhere; only the fuzz targets link libFuzzer's main().
  add_compile_options(-fsanitize=fuzzer-no-link)
  add_compile_definitions(SPRITETORCH_FUZZING=1)
endif()

if(SPRITETORCH_SANITIZE)
  message(STATUS "spritetorch: -fsanitize=${SPRITETORCH_SANITIZE}")
  # -fno-sanitize-recover: the first UB report fails the test instead of scrolling past.
  # -fno-sanitize=vptr: LibTorch's classes come from an uninstrumented library whose type_info the
  # vptr check cannot always match; every other UB check stays on.
  # -gline-tables-only: reports need file:line, not variables; with it (after the build type's
  # -g, so it wins) a translation unit compiles in 12 s instead of 16 and its object is half the size.
  add_compile_options(-fsanitize=${SPRITETORCH_SANITIZE} -fno-sanitize-recover=all
                      -fno-sanitize=vptr -fno-omit-frame-pointer -gline-tables-only)
  add_link_options(-fsanitize=${SPRITETORCH_SANITIZE})
endif()

# spritetorch_add_fuzzer(NAME SOURCE): a libFuzzer program over the spritetorch library.
# fuzz/CMakeLists.txt calls it for every fuzz/*_fuzzer.cpp, so a new reader only adds that file
# (see fuzz/fuzz_util.h) and a seed folder fuzz/corpus/NAME/.
function(spritetorch_add_fuzzer name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE spritetorch)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/fuzz)
  target_compile_options(${name} PRIVATE ${SPRITETORCH_WARNINGS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  target_precompile_headers(${name} REUSE_FROM spritetorch)
  set_property(GLOBAL APPEND PROPERTY SPRITETORCH_FUZZERS ${name})
endfunction()
