# Tests of src/kernels (numeric formats and compute kernels).
encore_add_test(test_quants SOURCES quants_test.cpp quants_roundtrip_test.cpp
                LIBS encore_kernels LABELS unit)
encore_add_test(test_fp16 SOURCES fp16_test.cpp LIBS encore_kernels LABELS unit)
encore_add_test(test_matmul SOURCES matmul_test.cpp LIBS encore_kernels encore_util LABELS unit
                TIMEOUT 300)
encore_add_test(test_panel SOURCES panel_test.cpp LIBS encore_kernels encore_util LABELS unit)
