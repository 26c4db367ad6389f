# The settings table (include/encore/settings.h): every setting refused with
# the same bad values, naming it, by every front end that exposes it (CLI
# flags through the binary, the OpenAI parser, Request::validate,
# Server::create, EngineOptions::validate); docs/settings.md holds the table.
encore_add_test(test_settings SOURCES settings_test.cpp LIBS encore_server encore_engine encore_api
                LABELS cli DEFINES ENCORE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TIMEOUT 120)
