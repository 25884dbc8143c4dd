# llmtrain_output_test(NAME name [EXIT status] [SKIP status] MATCHES regex [FAILS regex]
#                      COMMAND command...)
# A test that passes when its output matches MATCHES (PASS_REGULAR_EXPRESSION) and its
# command exits with EXIT (0 when not given). CTest ignores the exit status once a pass regex
# is set, so the command runs under tests/support/expect_exit.sh, and the test's
# FAIL_REGULAR_EXPRESSION holds, besides FAILS, the line that script prints on any other
# status. SKIP sets SKIP_RETURN_CODE, which the script passes through. Other properties are
# set with set_tests_properties as usual (never PASS_ or FAIL_REGULAR_EXPRESSION):
# build.regex_matched_tests_check_the_exit_status (tests/support/check_output_tests.py) fails
# on a test that matches its output any other way.
include_guard(GLOBAL)
set(LLMTRAIN_EXPECT_EXIT ${CMAKE_CURRENT_LIST_DIR}/../tests/support/expect_exit.sh)
cmake_path(NORMAL_PATH LLMTRAIN_EXPECT_EXIT)
set(LLMTRAIN_EXIT_STATUS_FAILURE "expect_exit: FAILED")

function(llmtrain_output_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;EXIT;SKIP;MATCHES;FAILS" "COMMAND")
  if(NOT arg_NAME OR NOT arg_MATCHES OR NOT arg_COMMAND OR arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "llmtrain_output_test(${arg_NAME}): needs NAME, MATCHES and COMMAND (unexpected: '${arg_UNPARSED_ARGUMENTS}')")
  endif()
  if(NOT DEFINED arg_EXIT)
    set(arg_EXIT 0)
  endif()
  set(wrapper ${LLMTRAIN_EXPECT_EXIT} --exit ${arg_EXIT})
  if(DEFINED arg_SKIP)
    list(APPEND wrapper --skip ${arg_SKIP})
  endif()
  add_test(NAME ${arg_NAME} COMMAND ${wrapper} ${arg_COMMAND})
  set(fails "${LLMTRAIN_EXIT_STATUS_FAILURE}")
  if(DEFINED arg_FAILS)
    list(APPEND fails "${arg_FAILS}")
  endif()
  set_tests_properties(${arg_NAME} PROPERTIES PASS_REGULAR_EXPRESSION "${arg_MATCHES}" FAIL_REGULAR_EXPRESSION "${fails}")
  if(DEFINED arg_SKIP)
    set_tests_properties(${arg_NAME} PROPERTIES SKIP_RETURN_CODE ${arg_SKIP})
  endif()
endfunction()
