# The reproducibility contract end to end (docs/reproducibility.md): label
# `repro`. generate() on stories260K and synth models under every schedule,
# n, pause/resume; then the `encore run` CLI across process restarts.
encore_add_test(test_repro SOURCES repro_test.cpp repro_batch_test.cpp LIBS encore_engine encore_synth
                LABELS repro TIMEOUT 600)
encore_add_test(test_cli_repro SOURCES cli_repro_test.cpp LABELS repro TIMEOUT 600)
