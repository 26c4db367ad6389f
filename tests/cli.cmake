# Tests that run the `encore` binary end to end.
encore_add_test(test_cli_stories SOURCES cli_stories_test.cpp LABELS cli)
encore_add_test(test_cli_synth SOURCES cli_synth_test.cpp LABELS cli DEFINES ENCORE_SYNTH_HEAVY=0)
encore_add_test(test_cli_synth_heavy SOURCES cli_synth_test.cpp LABELS heavy
                DEFINES ENCORE_SYNTH_HEAVY=1)
encore_add_test(test_cli_bench SOURCES cli_bench_test.cpp LABELS cli)
# The demo model in the repo speaks English and scripts/run.sh runs it by default
# (issue "a fresh clone speaks English"); needs no ../shared but for one byte compare.
encore_add_test(test_cli_demo SOURCES cli_demo_test.cpp LABELS cli
                DEFINES ENCORE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TIMEOUT 60)
# Every `encore run` flag takes effect (request flags change the output,
# speed/memory flags keep it): issue "--seed is ignored".
encore_add_test(test_cli_flags SOURCES cli_flags_test.cpp LABELS repro TIMEOUT 600)
# `encore batch` against `encore run` one request at a time (issue "One engine").
encore_add_test(test_cli_batch SOURCES cli_batch_test.cpp LABELS repro TIMEOUT 600)
# Sessions, chat and the cache command across processes (disk, a real Redis).
encore_add_test(test_cli_session SOURCES cli_session_test.cpp LABELS repro TIMEOUT 600)
# `encore serve` over loopback HTTP (cpp-httplib client, promtool, the openai npm client).
pkg_check_modules(HTTPLIB_TEST REQUIRED IMPORTED_TARGET cpp-httplib)
encore_add_test(test_cli_serve SOURCES cli_serve_test.cpp LIBS PkgConfig::HTTPLIB_TEST LABELS cli
                DEFINES ENCORE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TIMEOUT 300)
# `encore serve` against hostile clients (raw sockets over loopback).
encore_add_test(test_cli_serve_hostile SOURCES cli_serve_hostile_test.cpp
                LIBS PkgConfig::HTTPLIB_TEST LABELS cli TIMEOUT 300)
# Requests through `encore serve`: unsupported OpenAI fields, an all-banning
# logit_bias and bad session ids get a 400 naming the field; special-token
# text from clients is plain text, roles are the template's; sessions: 404 when
# missing, session_continued, tenant shares of the state tiers.
encore_add_test(test_cli_serve_requests
                SOURCES cli_serve_api_test.cpp cli_serve_special_test.cpp cli_serve_session_test.cpp
                LIBS PkgConfig::HTTPLIB_TEST LABELS cli TIMEOUT 180)
# Seed hygiene and input normalisation through `encore serve` and `encore run`:
# --derive-seed, encore_seed_reuse_total, --normalize-input.
encore_add_test(test_cli_serve_seed SOURCES cli_serve_seed_test.cpp LIBS PkgConfig::HTTPLIB_TEST
                LABELS cli TIMEOUT 300)
# Chat requests through the model's own Jinja template (issue "Every model's own
# chat template"): the default, --chat-template-file, --template-now, errors with
# the template line, `encore template`, the server and the audit log's hash.
encore_add_test(test_cli_chat_template SOURCES cli_chat_template_test.cpp
                LIBS encore_engine PkgConfig::HTTPLIB_TEST LABELS cli TIMEOUT 300
                DEFINES ENCORE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
