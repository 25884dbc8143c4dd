# Writes OUTPUT, a header defining LLMTRAIN_GIT_COMMIT: the commit SOURCE_DIR is checked out
# at (12 hex digits, "-dirty" when tracked files differ from it), or "unknown" outside a git
# checkout or without git. Run at every build; the header is rewritten only when the text
# changes, so an unchanged commit recompiles nothing.
set(commit unknown)
if(GIT_EXECUTABLE)
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
file(WRITE ${OUTPUT}.tmp "#define LLMTRAIN_GIT_COMMIT \"${commit}\"\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
