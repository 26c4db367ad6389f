# Chat templates (issue 29): `encore template` renders every real template in
# ${ENCORE_SHARED_DIR}/testdata/chat_templates over the conversations in
# tests/jinja/conversations byte for byte as python3-jinja2 does when set up like
# transformers' apply_chat_template (tests/jinja/oracle.py). A table template x
# conversation and the failing cells are printed (--output-on-failure; --verbose for
# the first differing bytes: python3 tests/jinja/compare.py --encore build/encore -v).
# Skipped (exit 77, reason printed) when python3-jinja2 or the templates are missing.
# Starts with the harness's self-test; about 600 renders, 2 at a time.
add_test(NAME test_jinja_templates
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/jinja/compare.py
                 --encore $<TARGET_FILE:encore>
                 --templates ${ENCORE_SHARED_DIR}/testdata/chat_templates
                 --skip-missing)
set_tests_properties(test_jinja_templates PROPERTIES LABELS cli TIMEOUT 600 SKIP_RETURN_CODE 77)
# The harness alone: stand-in renderers (right, wrong by one byte, refusing, crashing,
# a wrong raise_exception message) must be classified as such. No binary, no data.
add_test(NAME test_jinja_harness
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/jinja/compare.py --self-test --skip-missing)
set_tests_properties(test_jinja_harness PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)
# The renderer through include/encore/jinja.h: content marks, limits, error
# lines, refusals, deep nesting, determinism, the clock (and the fuzz finds).
encore_add_test(test_jinja SOURCES jinja_test.cpp LIBS encore_jinja LABELS unit)
# The synthetic edge cases (tests/jinja/cases: one feature each, with its own
# context) against the oracle; constructs encore refuses on purpose are marked
# in the case and must be refused. Skipped (77) without python3-jinja2.
add_test(NAME test_jinja_cases
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/jinja/compare.py
                 --encore $<TARGET_FILE:encore>
                 --cases ${CMAKE_CURRENT_SOURCE_DIR}/jinja/cases
                 --skip-missing)
set_tests_properties(test_jinja_cases PROPERTIES LABELS cli TIMEOUT 300 SKIP_RETURN_CODE 77)
# Random whitespace-control templates (tests/jinja/random_ws.py: -/+ on every tag
# kind, raw blocks, CRLF, trailing newlines), 300 for a fixed seed, against the oracle.
add_test(NAME test_jinja_whitespace
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/jinja/random_ws.py
                 --encore $<TARGET_FILE:encore> --count 300 --seed 1 --skip-missing)
set_tests_properties(test_jinja_whitespace PROPERTIES LABELS cli TIMEOUT 300 SKIP_RETURN_CODE 77)
# Random statement templates (nested for/else, loop filters, break/continue, if, set,
# block set, namespaces, with, macros anywhere) over cases/context.json.
add_test(NAME test_jinja_statements
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/jinja/random_ws.py
                 --encore $<TARGET_FILE:encore> --kind statements --count 300 --seed 1
                 --skip-missing)
set_tests_properties(test_jinja_statements PROPERTIES LABELS cli TIMEOUT 300 SKIP_RETURN_CODE 77)
