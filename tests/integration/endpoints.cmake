# test_endpoints (tests/integration/test_endpoints.c, registered by the glob in CMakeLists.txt):
# the endpoint registry end to end on the real stack. It runs the sluicectl binary, so that
# must be built first; it reads SLUICE_KAFKA_BROKERS / SLUICE_PG_DSN from the environment
# (eval "$(scripts/stack.sh env)", or tests/integration/run_private.sh test_endpoints with a private stack).
if(TARGET test_endpoints AND TARGET sluicectl)
  add_dependencies(test_endpoints sluicectl)
  math(EXPR _t "240 * ${SL_TEST_TIMEOUT_MULT}")
  set_tests_properties(test_endpoints PROPERTIES LABELS integration TIMEOUT ${_t}
                       ENVIRONMENT "SL_TEST_TIMEOUT_MULT=${SL_TEST_TIMEOUT_MULT}")
endif()
