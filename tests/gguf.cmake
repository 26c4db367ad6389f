# GGUF reader, writer and fingerprint (src/gguf).
encore_add_test(test_gguf
  SOURCES gguf_reader_test.cpp gguf_errors_test.cpp gguf_fingerprint_test.cpp
  LIBS encore_gguf
  LABELS unit)
encore_add_test(test_gguf_data
  SOURCES gguf_data_test.cpp
  LIBS encore_gguf
  LABELS data)
