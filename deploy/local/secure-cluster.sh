# The secured cluster mode (stack up --cluster --secure), sourced by deploy/local/stack
# after secure.sh: three KRaft nodes and a Redis Cluster as secured as the single nodes,
# with the same CA, certificate, principals and passwords, beside the secured PostgreSQL.
#
# - Kafka: each node a broker and a controller; SASL_SSL only (SCRAM-SHA-512), ACLs on,
#   brokers replicating to each other as inorder-super; controllers voting over mutual
#   TLS. Replication factor 3 and min ISR 2, as in the plain cluster.
# - Redis: six nodes (three masters, a replica each) on TLS ports only; the cluster bus
#   and replication over TLS too; replicas sync as inorder-super; the same ACL users as
#   the single node.
#
# Ports: Redis nodes BASE+21..26 (bus BASE+31..36), Kafka brokers BASE+121..123 and
# controllers BASE+131..133, BASE being INORDER_CLUSTER_PORT_BASE.

KSCLUSTER_DIR=$SECURE_DIR/kafka-cluster
RSCLUSTER_DIR=$SECURE_DIR/redis-cluster
SECURE_CLUSTER_SERVICES=(postgres_secure kafka_cluster_secure redis_cluster_secure)

# ---------------------------------------------------------------- kafka

kscluster_port() { echo $((CLUSTER_BASE + 120 + $1)); }
kscluster_controller() { echo $((CLUSTER_BASE + 130 + $1)); }
kscluster_bootstrap() {
  local n out=()
  for n in "${CLUSTER_NODES[@]}"; do out+=("127.0.0.1:$(kscluster_port "$n")"); done
  (IFS=,; echo "${out[*]}")
}

# A node is up when its log says it started (a KRaft broker says so once the controllers
# have unfenced it) since it was launched, and its port answers TLS with our CA.
kscluster_node_ready() {
  secure_broker_up "$KSCLUSTER_DIR/$1/logs/server.log" "${2:-0}" "$(kscluster_port "$1")"
}
kscluster_ready() {
  local n
  for n in "${CLUSTER_NODES[@]}"; do
    kscluster_node_ready "$n" "${KSCLUSTER_FROM[n]:-0}" || return 1
  done
}

kafka_cluster_secure_start() {
  local n voters="" cluster_id
  secure_credentials
  secure_certs
  ensure_kafka_jars
  mkdir -p "$KSCLUSTER_DIR"
  for n in "${CLUSTER_NODES[@]}"; do
    voters+="${voters:+,}$n@127.0.0.1:$(kscluster_controller "$n")"
  done
  # Formatted for other principals (an older stack): formatted again; test topics only.
  if [ "$(cat "$KSCLUSTER_DIR/principals" 2>/dev/null)" != "${SECURE_PRINCIPALS[*]}" ]; then
    kafka_cluster_secure_stop
    rm -rf "${KSCLUSTER_DIR:?}"/[0-9] "$KSCLUSTER_DIR/cluster.id"
  fi
  if [ ! -s "$KSCLUSTER_DIR/cluster.id" ]; then
    kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1 >"$KSCLUSTER_DIR/cluster.id"
  fi
  cluster_id=$(cat "$KSCLUSTER_DIR/cluster.id")
  declare -ga KSCLUSTER_FROM=()
  for n in "${CLUSTER_NODES[@]}"; do
    local dir=$KSCLUSTER_DIR/$n
    if pid_alive "$dir/kafka.pid"; then continue; fi
    refuse_foreign kafka_cluster_secure "$(kscluster_port "$n")" "$dir/kafka.pid"
    refuse_foreign kafka_cluster_secure "$(kscluster_controller "$n")" "$dir/kafka.pid"
    mkdir -p "$dir/data" "$dir/logs"
    (
      umask 077
      sed -e '/^listeners=/d' -e '/^advertised.listeners=/d' -e '/^inter.broker.listener.name=/d' \
        -e '/^listener.security.protocol.map=/d' "$HERE/kafka/cluster.properties.in" \
        | cat - "$HERE/kafka/security.properties.in" \
        | sed -e "s|@NODE_ID@|$n|g" -e "s|@VOTERS@|$voters|g" \
          -e "s|@KAFKA_PORT@|$(kscluster_port "$n")|g" \
          -e "s|@CONTROLLER_PORT@|$(kscluster_controller "$n")|g" \
          -e "s|@DATA_DIR@|$dir/data|g" -e "s|@CERTS@|$CERTS|g" \
          -e "s|@MORE_LISTENERS@||g" -e "s|@MORE_ADVERTISED@||g" -e "s|@MORE_PROTOCOLS@||g"
      kafka_inter_broker_login
    ) >"$dir/server.properties"
    if [ ! -f "$dir/data/meta.properties" ]; then
      kafka_java -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
        -Dkafka.logs.dir="$dir/logs" kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$dir/server.properties" "$(scram_file "$dir")" >"$dir/logs/format.log" 2>&1 \
        || die "Kafka (secure) node $n storage format failed, see $dir/logs/format.log"
      rm -f "$dir/scram.args"
    fi
    KSCLUSTER_FROM[n]=$(log_size "$dir/logs/server.log")
    setsid nohup java -Xms256m -Xmx512m -XX:+UseG1GC -XX:TieredStopAtLevel=1 \
      -Djava.awt.headless=true -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
      -Dkafka.logs.dir="$dir/logs" -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
      >"$dir/logs/stdout.log" 2>&1 </dev/null &
    echo $! >"$dir/kafka.pid"
  done
  echo "${SECURE_PRINCIPALS[*]}" >"$KSCLUSTER_DIR/principals"
  wait_for kafka_cluster_secure "$KSCLUSTER_DIR/N/logs/server.log" kscluster_ready
  say "kafka cluster (secure) up on $(kscluster_bootstrap) (SASL_SSL, SCRAM-SHA-512, ACLs on)"
}

kafka_cluster_secure_stop() {
  stop_nodes "kafka cluster (secure)" "$KSCLUSTER_DIR" kafka.pid "${CLUSTER_NODES[@]}"
}

kafka_cluster_secure_status() {
  local n
  for n in "${CLUSTER_NODES[@]}"; do
    pid_alive "$KSCLUSTER_DIR/$n/kafka.pid" && kscluster_node_ready "$n" || return 1
  done
}

# ---------------------------------------------------------------- redis

rscluster_port() { echo $((CLUSTER_BASE + 20 + $1)); }
rscluster_cli() {
  REDISCLI_AUTH=$(password super) redis-cli --tls --cacert "$CERTS/ca.pem" -h 127.0.0.1 \
    -p "$(rscluster_port "$1")" --user inorder-super "${@:2}"
}
rscluster_node_ready() { [ "$(rscluster_cli "$1" ping 2>/dev/null)" = PONG ]; }
rscluster_ok() {
  local n
  for n in "${REDIS_CLUSTER_NODES[@]}"; do
    rscluster_cli "$n" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done
}

redis_cluster_secure_start() {
  local n nodes=() from=()
  secure_credentials
  secure_certs
  mkdir -p "$RSCLUSTER_DIR"
  for n in "${REDIS_CLUSTER_NODES[@]}"; do
    local dir=$RSCLUSTER_DIR/$n port; port=$(rscluster_port "$n")
    nodes+=("127.0.0.1:$port")
    if pid_alive "$dir/redis.pid" && rscluster_node_ready "$n"; then continue; fi
    refuse_foreign redis_cluster_secure "$port" "$dir/redis.pid"
    mkdir -p "$dir/data"
    (
      umask 077
      sed -e "s|@REDIS_PORT@|0|g" -e "s|@STATE_DIR@|$dir|g" "$HERE/redis.conf.in"
      redis_tls_settings "$port"
      printf '%s\n' "tls-cluster yes" "tls-replication yes" \
        "cluster-enabled yes" "cluster-config-file $dir/data/nodes.conf" \
        "cluster-port $((port + 10))" "cluster-node-timeout 2000" \
        "cluster-replica-validity-factor 0" \
        "masteruser inorder-super" "masterauth $(password super)"
      redis_acl_users
    ) >"$dir/redis.conf"
    from[n]=$(log_size "$dir/redis.log")
    redis-server "$dir/redis.conf" \
      || die "redis (secure) cluster node $n did not start; see $dir/redis.log"
  done
  for n in "${REDIS_CLUSTER_NODES[@]}"; do
    FATAL=$REDIS_FATAL FATAL_FROM=${from[n]:-0} wait_for "redis (secure) cluster node $n" \
      "$RSCLUSTER_DIR/$n/redis.log" rscluster_node_ready "$n"
  done
  if [ "$(rscluster_cli 1 cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')" = 1 ]; then
    say "creating the Redis Cluster (secure; 3 masters, 1 replica each)"
    REDISCLI_AUTH=$(password super) redis-cli --tls --cacert "$CERTS/ca.pem" \
      --user inorder-super --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
      >"$RSCLUSTER_DIR/create.log" 2>&1 \
      || die "redis-cli --cluster create failed, see $RSCLUSTER_DIR/create.log"
  fi
  wait_for redis_cluster_secure "$RSCLUSTER_DIR/create.log" rscluster_ok
  say "redis cluster (secure) up on 127.0.0.1:$(rscluster_port 1)-$(rscluster_port 6) (TLS only, ACL users)"
}

redis_cluster_secure_stop() {
  stop_nodes "redis cluster (secure)" "$RSCLUSTER_DIR" redis.pid "${REDIS_CLUSTER_NODES[@]}"
}

redis_cluster_secure_status() {
  local n
  for n in "${REDIS_CLUSTER_NODES[@]}"; do pid_alive "$RSCLUSTER_DIR/$n/redis.pid" || return 1; done
  rscluster_ok
}

# ---------------------------------------------------------------- env

# What secure_env prints, with the cluster's addresses: the brokers, three Redis seeds in
# each program's URL, and every node's port for the tests that look at each server.
secure_cluster_env() {
  local n seeds=() ports=()
  for n in 1 2 3; do seeds+=("127.0.0.1:$(rscluster_port "$n")"); done
  for n in "${REDIS_CLUSTER_NODES[@]}"; do ports+=("$(rscluster_port "$n")"); done
  REDIS_HOSTS=$(IFS=,; echo "${seeds[*]}") KAFKA_BOOTSTRAP=$(kscluster_bootstrap) secure_env
  echo "export INORDER_SECURE_CLUSTER=1"
  echo "export INORDER_SECURE_REDIS_PORTS='${ports[*]}'"
  echo "export INORDER_SECURE_KAFKA_BROKERS='${CLUSTER_NODES[*]}'"
}
