# One ctest test per GoogleTest suite (`Suite.*`), not one per test case as gtest_discover_tests
# makes: every test process pays LibTorch's load and static initialisers (~0.6 s in Release,
# ~1.4 s under ASan: docs/benchmarks.md), which was most of the time of ~410 short cases; ~120
# suites pay it once each. Cases named in SOLO get a test of their own (and leave their suite's
# filter), so a script can exclude one (`ctest -E`) or ctest can start a long one early.
#
#   spritetorch_add_test_suites(TARGET
#     SOLO Suite.Case ...             cases run alone, under their full name
#     COSTS Suite seconds ...         ctest's COST for a fresh build folder (long ones start first)
#     ENVIRONMENT VAR=value ...       as the test property
#     ENVIRONMENT_MODIFICATION ...)   as the test property
#
# The list is read from the built binary (--gtest_list_tests) after each build, as
# gtest_discover_tests does, so a new test needs no CMake change. Suites whose name ends in "Cuda"
# (GPU tests: they skip without one) get the label cuda, the rest cpu. The binary's main
# (tests/test_main.cpp) exits 77 when every case it ran was skipped, so a suite that only skips
# shows as skipped (SKIP_RETURN_CODE).
function(spritetorch_add_test_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOLO;COSTS;ENVIRONMENT;ENVIRONMENT_MODIFICATION")
  set(prefix "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  # What the build-time step needs, written now with bracket quoting: the values hold ';', '=' and
  # ':' that a -D on a custom command's line would split.
  set(settings "")
  foreach(name IN ITEMS SOLO COSTS ENVIRONMENT ENVIRONMENT_MODIFICATION)
    string(APPEND settings "set(${name}")
    foreach(item IN LISTS arg_${name})
      string(APPEND settings " [==[${item}]==]")
    endforeach()
    string(APPEND settings ")\n")
  endforeach()
  string(APPEND settings "set(WORKING_DIRECTORY [==[${CMAKE_CURRENT_BINARY_DIR}]==])\n")
  # Rewritten only when it changes (configure_file), and a link dependency with the writer: a
  # changed list or writer relinks the binary, which runs the step again.
  file(WRITE "${prefix}_suite_settings.cmake.new" "${settings}")
  configure_file("${prefix}_suite_settings.cmake.new" "${prefix}_suite_settings.cmake" COPYONLY)
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${prefix}_suite_settings.cmake"
               "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/SpritetorchTestSuitesWrite.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" -D "TEST_BINARY=$<TARGET_FILE:${target}>"
            -D "SETTINGS=${prefix}_suite_settings.cmake" -D "CTEST_FILE=${prefix}_suites.cmake"
            -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/SpritetorchTestSuitesWrite.cmake"
    VERBATIM)
  file(WRITE "${prefix}_suites_include.cmake"
       "if(EXISTS [==[${prefix}_suites.cmake]==])\n"
       "  include([==[${prefix}_suites.cmake]==])\n"
       "else()\n"
       "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${prefix}_suites_include.cmake")
endfunction()
