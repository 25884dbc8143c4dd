# Writes OUTPUT, a header defining LLMTRAIN_GIT_COMMIT: COMMIT when given (a build whose
# source tree has no .git, told by the one that has), else the commit SOURCE_DIR is checked
# out at (12 hex digits, "-dirty" when tracked files differ from it), or "unknown" outside a
# git checkout or without git. Run at every build; the header is rewritten only when the text
# changes, so an unchanged commit recompiles nothing. With OUTPUT unset it prints the commit
# (scripts/container-build-args.sh names the image's commit so).
set(commit unknown)
if(COMMIT)
  if(NOT COMMIT MATCHES "^([0-9a-f]+(-dirty)?|unknown)$")
    message(FATAL_ERROR "LLMTRAIN_GIT_COMMIT='${COMMIT}': expected a commit's hex digits, optionally followed by -dirty, or unknown")
  endif()
  set(commit ${COMMIT})
elseif(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(status EQUAL 0 AND NOT head STREQUAL "")
    set(commit ${head})
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
    if(dirty EQUAL 1)
      string(APPEND commit "-dirty")
    endif()
  endif()
endif()
if(NOT OUTPUT)
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo ${commit})
  return()
endif()
file(WRITE ${OUTPUT}.tmp "#define LLMTRAIN_GIT_COMMIT \"${commit}\"\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
