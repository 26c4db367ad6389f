# Encore behind HAProxy: 3 replicas sharing one Redis, started by deploy/local-cluster.sh
# with the shipped deploy/haproxy.cfg and deploy/redis.conf (issue 28): session affinity
# (RAM prefix-cache hits), failover after a SIGKILL (answers equal `encore run --session`,
# KV restored from Redis), answers in flight on a killed replica fail at the client, Redis
# down and back, a rolling restart under 16 clients (0 failed, 0 different).
# Loopback only, about 2 minutes; skipped (exit 77) when haproxy or redis-server is
# missing, with the reason printed. Python 3 standard library only.
set(ENCORE_CLUSTER_TEST_ARGS
    --encore $<TARGET_FILE:encore>
    --model ${ENCORE_SHARED_DIR}/models/stories260K.gguf
    --cluster-script ${PROJECT_SOURCE_DIR}/deploy/local-cluster.sh)
if(ENCORE_SKIP_SHARED_TESTS)
  list(APPEND ENCORE_CLUSTER_TEST_ARGS --skip-missing-model)
endif()
add_test(NAME test_cluster
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cluster/cluster_test.py ${ENCORE_CLUSTER_TEST_ARGS})
set_tests_properties(test_cluster PROPERTIES LABELS cli TIMEOUT 300 SKIP_RETURN_CODE 77)
