# The generation loop (src/engine) on a synthetic model.
encore_add_test(test_engine SOURCES engine_test.cpp LIBS encore_engine encore_synth LABELS unit)
# Sessions and KV snapshots through the engine: disk and a real Redis.
encore_add_test(test_engine_state SOURCES engine_state_test.cpp LIBS encore_engine encore_synth
                LABELS unit)
