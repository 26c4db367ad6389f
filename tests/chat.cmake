# Chat templates, special tokens and end-of-generation sets, and the
# tokenize/detokenize/run --chat commands.
encore_add_test(test_chat_template SOURCES chat_template_test.cpp LIBS encore_tokenizer
                LABELS unit)
encore_add_test(test_special_tokens SOURCES special_tokens_test.cpp
                LIBS encore_tokenizer encore_gguf LABELS data)
encore_add_test(test_cli_tokenize SOURCES cli_tokenize_test.cpp LABELS cli)
# Chat prompts on real vocabularies: message content is plain text, and
# conversations without special-token text keep their ids.
encore_add_test(test_chat_special SOURCES chat_special_test.cpp
                LIBS encore_tokenizer encore_gguf LABELS data)
