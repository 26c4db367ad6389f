# Thread pool, kernels, KV cache and the model forward pass.
encore_add_test(test_thread_pool SOURCES thread_pool_test.cpp LIBS encore_util LABELS unit)
encore_add_test(test_ops SOURCES ops_test.cpp LIBS encore_kernels encore_util LABELS unit)
encore_add_test(test_kv_cache SOURCES kv_cache_test.cpp LIBS encore_kv LABELS unit)
encore_add_test(test_model SOURCES model_test.cpp LIBS encore_model LABELS unit)
encore_add_test(test_llama_stories SOURCES llama_stories_test.cpp LIBS encore_model LABELS data)
