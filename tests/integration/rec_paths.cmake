# The recorder's two sources of its rules (tests/integration/test_rec_paths.c, registered by the
# glob in CMakeLists.txt): rec_agg against HEALTH_SQL and REC_DB_REPLACES_SQL against
# deliveries_replaces() in private databases on the shared PostgreSQL (SLUICE_PG_DSN), and the
# outcome_state check at connect, which also runs the real sluice-recorder.
if(TARGET test_rec_paths AND TARGET sluice-recorder)
  add_dependencies(test_rec_paths sluice-recorder)
  math(EXPR _t "300 * ${SL_TEST_TIMEOUT_MULT}")
  set_tests_properties(test_rec_paths PROPERTIES LABELS integration TIMEOUT ${_t})
endif()
