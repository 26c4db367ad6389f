# The generation loop (src/engine) on a synthetic model.
encore_add_test(test_engine SOURCES engine_test.cpp LIBS encore_engine encore_synth LABELS unit)
# Sessions and KV snapshots through the engine: disk and a real Redis.
encore_add_test(test_engine_state SOURCES engine_state_test.cpp LIBS encore_engine encore_synth
                LABELS unit)
# Where the repacked weights live: the panel cache file (--mmap), memory, the
# model file's copy given back.
encore_add_test(test_panel_cache SOURCES panel_cache_test.cpp LIBS encore_engine encore_synth
                LABELS unit)
# The scheduler's plan alone: a KV pool and hand-made jobs, no model.
encore_add_test(test_scheduler SOURCES scheduler_test.cpp LIBS encore_engine LABELS unit)
# Seed hygiene: derived seeds (HMAC encoding, the secret file's checks), the
# seed-reuse window's bounds, the engine's seed sources; normalized session text.
encore_add_test(test_seed SOURCES seed_test.cpp LIBS encore_engine encore_synth LABELS unit)
