# The audit log: chain, rotation, recovery and damage named at its line
# (no model); end to end through `encore serve`, `encore batch`, `encore
# audit verify` and `encore replay` (the stories model).
encore_add_test(test_audit SOURCES audit_test.cpp LIBS encore_audit encore_server LABELS unit)
encore_add_test(test_cli_audit SOURCES cli_audit_test.cpp LIBS encore_audit PkgConfig::HTTPLIB_TEST
                LABELS cli TIMEOUT 300)
