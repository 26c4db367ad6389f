# Tokenizer: unit tests on hand-built vocabularies, data tests on the SPM
# vocabularies in ../shared (llama.cpp's test vectors).
encore_add_test(test_tokenizer SOURCES tokenizer_test.cpp LIBS encore_tokenizer encore_gguf
                LABELS unit TIMEOUT 300)
encore_add_test(test_tokenizer_data SOURCES tokenizer_data_test.cpp
                LIBS encore_tokenizer encore_gguf LABELS data TIMEOUT 300)
# Byte-level BPE and WordPiece: unit tests on hand-built vocabularies, data
# tests on every BPE/WordPiece vocabulary in ../shared/testdata/vocab.
encore_add_test(test_tokenizer_bpe_data SOURCES tokenizer_bpe_data_test.cpp
                LIBS encore_tokenizer encore_gguf LABELS data TIMEOUT 300)
encore_add_test(test_tokenizer_bpe SOURCES tokenizer_bpe_test.cpp LIBS encore_tokenizer
                LABELS unit TIMEOUT 300)
