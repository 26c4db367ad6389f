# Thread pool, kernels, KV cache and the model forward pass.
encore_add_test(test_thread_pool SOURCES thread_pool_test.cpp LIBS encore_util LABELS unit)
encore_add_test(test_ops SOURCES ops_test.cpp LIBS encore_kernels encore_util LABELS unit)
encore_add_test(test_kv_cache SOURCES kv_cache_test.cpp LIBS encore_kv LABELS unit)
encore_add_test(test_model SOURCES model_test.cpp LIBS encore_model LABELS unit)
encore_add_test(test_llama_stories SOURCES llama_stories_test.cpp LIBS encore_model LABELS data)
# The invariance contract end to end (docs/invariance.md): label `invariance`.
encore_add_test(test_invariance SOURCES invariance_test.cpp
                LIBS encore_model encore_synth LABELS invariance TIMEOUT 600)
# llama / qwen2 / qwen3 loading and RoPE scaling on synth presets, and the
# forward pass against the double-precision reference (tests/reference_forward.h).
encore_add_test(test_arch SOURCES arch_test.cpp LIBS encore_model encore_synth LABELS unit)
encore_add_test(test_arch_forward SOURCES arch_forward_test.cpp reference_forward.cpp
                LIBS encore_model encore_synth LABELS unit)
# Not a test (no ctest registration): engine logits vs the double reference,
# max/mean relative error and KL per model file. Usage in accuracy_report.cpp.
add_executable(accuracy_report accuracy_report.cpp reference_forward.cpp)
target_link_libraries(accuracy_report PRIVATE encore_model)
target_include_directories(accuracy_report PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
