encore_add_test(test_sampling SOURCES sampling_test.cpp LIBS encore_sampling LABELS unit)
# Stop strings across token boundaries (src/engine/stop_text.h).
encore_add_test(test_stop_text SOURCES stop_text_test.cpp LIBS encore_engine LABELS unit)
# Chi-square faithfulness of every stage, and ISA independence of the draws.
encore_add_test(test_sampler_faithfulness SOURCES sampler_faithfulness_test.cpp LIBS encore_sampling LABELS unit)
