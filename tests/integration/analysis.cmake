# Analysis and operations (sql/0003_analysis.sql; sluicectl health, slow, dead-letters, alerts,
# latency, replay, retries). test_analysis_sql.c (registered by the glob in CMakeLists.txt)
# checks the SQL rules with synthetic rows in a private database it creates on the shared
# PostgreSQL (SLUICE_PG_DSN). The commands themselves are exercised end to end by
# tests/e2e/test_analysis.py.
if(TARGET test_analysis_sql)
  math(EXPR _t "120 * ${SL_TEST_TIMEOUT_MULT}")
  set_tests_properties(test_analysis_sql PROPERTIES LABELS integration TIMEOUT ${_t})
endif()
