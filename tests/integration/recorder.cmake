# sluice-recorder integration test (tests/integration/test_recorder.c, registered by the glob in
# CMakeLists.txt) runs the real binary, so it must be built first; it reads SLUICE_KAFKA_BROKERS
# / SLUICE_PG_DSN from the environment (eval "$(scripts/stack.sh env)", or
# tests/integration/run_private.sh test_recorder with a private stack).
# sl-test-outcomes publishes synthetic outcome records (bench/recorder.sh).
if(TARGET test_recorder AND TARGET sluice-recorder)
  add_dependencies(test_recorder sluice-recorder)
  math(EXPR _t "600 * ${SL_TEST_TIMEOUT_MULT}")
  set_tests_properties(test_recorder PROPERTIES LABELS integration TIMEOUT ${_t}
                       ENVIRONMENT "SL_TEST_TIMEOUT_MULT=${SL_TEST_TIMEOUT_MULT}")
endif()

add_executable(sl-test-outcomes ${CMAKE_CURRENT_LIST_DIR}/outcome_gen.c)
target_link_libraries(sl-test-outcomes PRIVATE sluice_common)
sl_target_warnings(sl-test-outcomes)
