# The state store (src/store): the disk tier and the record format, and the
# Redis tier against a redis-server each test starts itself.
encore_add_test(test_store SOURCES store_test.cpp LIBS encore_store LABELS unit)
encore_add_test(test_store_redis SOURCES store_redis_test.cpp LIBS encore_store LABELS unit)
