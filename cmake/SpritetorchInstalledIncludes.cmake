# Run by `cmake --install` after the headers are copied (SpritetorchInstall.cmake): each installed
# header's #include "<module>/x.h" of another spritetorch header becomes
# #include <spritetorch/<module>/x.h>, so a user's own header of the same name cannot stand in.
set(_root "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${SPRITETORCH_INSTALLED_HEADERS}")
file(GLOB _modules LIST_DIRECTORIES true RELATIVE "${_root}" "${_root}/*")
list(FILTER _modules EXCLUDE REGEX "\\.")  # the folders: common, data, train, ...
string(JOIN "|" _module_names ${_modules})
file(GLOB_RECURSE _headers "${_root}/*.h")
foreach(_header IN LISTS _headers)
  file(READ "${_header}" _text)
  string(REGEX REPLACE "#include \"((${_module_names})/[^\"]+)\"" "#include <spritetorch/\\1>"
         _rewritten "${_text}")
  if(NOT _rewritten STREQUAL _text)
    file(WRITE "${_header}" "${_rewritten}")
  endif()
endforeach()
