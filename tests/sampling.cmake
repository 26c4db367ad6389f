encore_add_test(test_sampling SOURCES sampling_test.cpp LIBS encore_sampling LABELS unit)
