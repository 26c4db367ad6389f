#OpenAI request bodies and `encore batch` lines->Request(src / api).
encore_add_test(test_openai_request SOURCES openai_request_test.cpp LIBS encore_api LABELS unit)
