# OpenAI request bodies, `encore batch` lines and the server's bodies -> Request (src/api).
encore_add_test(test_openai_request SOURCES openai_request_test.cpp openai_server_request_test.cpp
                LIBS encore_api LABELS unit)
# The HTTP request reader of `encore serve` (src/server): limits and framing.
encore_add_test(test_http_reader SOURCES http_reader_test.cpp LIBS encore_server LABELS unit)
