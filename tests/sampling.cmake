encore_add_test(test_sampling SOURCES sampling_test.cpp LIBS encore_sampling LABELS unit)
# Stop strings across token boundaries (src/engine/stop_text.h).
encore_add_test(test_stop_text SOURCES stop_text_test.cpp LIBS encore_engine LABELS unit)
