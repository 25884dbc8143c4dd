# Fails the build when a file includes a header of a layer it may not depend on: the layers
# point one way (docs/architecture.md, "Layers"), and an upward include is a build error, not
# a review comment. Run with -DSOURCE_DIR=... -DSTAMP=...; the allowed includes of each layer are
# LAYER_<name> (a ;-list), passed by CMakeLists.txt from the same table its libraries use.
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...)
file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cpp ${SOURCE_DIR}/kernels/*.h
     ${SOURCE_DIR}/kernels/*.cu ${SOURCE_DIR}/kernels/*.cuh)
set(problems "")
foreach(file IN LISTS files)
  if(file MATCHES "^kernels/")
    set(layer kernels)
  elseif(file MATCHES "^src/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
  else()
    continue()  # src/main.cpp: the top
  endif()
  if(NOT DEFINED LAYER_${layer})
    string(APPEND problems "\n  ${file}: '${layer}' is not a layer of the table in CMakeLists.txt")
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/${file} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+)/.*" "\\1" included "${line}")
    if(NOT included STREQUAL layer AND NOT included IN_LIST LAYER_${layer})
      string(REPLACE ";" ", " allowed "${LAYER_${layer}}")
      string(APPEND problems "\n  ${file} includes \"${included}/...\": ${layer}/ may include only ${allowed}")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "llmtrain: an include points up the layers:${problems}")
endif()
file(TOUCH ${STAMP})
