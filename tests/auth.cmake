# The API key file of `encore serve --api-keys` (src/server/auth.*).
encore_add_test(test_auth SOURCES auth_test.cpp LIBS encore_server LABELS unit)
