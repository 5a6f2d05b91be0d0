# The local stack's Debezium, sourced by deploy/local/stack: a Kafka Connect worker
# (standalone, at the broker's version) with Debezium's PostgreSQL source connector and its
# outbox EventRouter in its plugin folder, both from Maven Central, on loopback. It serves
# the plaintext stack's Kafka and PostgreSQL (which runs with wal_level=logical for it).
# Connectors are added over its REST API (INORDER_CONNECT_PORT, 18083 by default).

CONNECT_PORT=${INORDER_CONNECT_PORT:-18083}
DEBEZIUM_DIR=$STATE/debezium
DEBEZIUM_VERSION=$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' \
  "$HERE/debezium/plugin-pom.xml")
CONNECT_LIBS=$CACHE/connect-$KAFKA_VERSION/libs
DEBEZIUM_PLUGINS=$CACHE/debezium-$DEBEZIUM_VERSION/plugins

# fetch_jars POM FOLDER: every runtime jar POM names, into FOLDER, once.
fetch_jars() {
  local pom=$1 into=$2 work
  [ -f "$into/.complete" ] && return 0
  work=$(dirname "$into")/build
  say "fetching $(basename "$pom" .xml) jars from Maven Central into $into"
  mkdir -p "$work"
  cp "$pom" "$work/pom.xml"
  rm -rf "$into"
  (cd "$work" && mvn -q -B -s "$HERE/debezium/maven-settings.xml" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$into" \
      >"$work/mvn.log" 2>&1) || die "Maven could not fetch the jars of $pom, see $work/mvn.log"
  touch "$into/.complete"
}

connect_ready() {
  curl -sf "http://127.0.0.1:$CONNECT_PORT/connector-plugins" 2>/dev/null \
    | grep -q 'io.debezium.connector.postgresql.PostgresConnector'
}

debezium_start() {
  if pid_alive "$DEBEZIUM_DIR/connect.pid" && connect_ready; then
    say "debezium (Kafka Connect) already running on 127.0.0.1:$CONNECT_PORT"; return 0
  fi
  refuse_foreign debezium "$CONNECT_PORT" "$DEBEZIUM_DIR/connect.pid"
  postgres_status || die "debezium needs the stack's postgres: stack up postgres kafka debezium"
  kafka_status || die "debezium needs the stack's kafka: stack up postgres kafka debezium"
  local level
  level=$(psql -X -At "postgresql://$PG_USER@127.0.0.1:$PG_PORT/$PG_DB" -c 'SHOW wal_level')
  [ "$level" = logical ] \
    || die "postgres runs with wal_level=$level, Debezium needs logical: stack restart postgres"
  fetch_jars "$HERE/debezium/worker-pom.xml" "$CONNECT_LIBS"
  fetch_jars "$HERE/debezium/plugin-pom.xml" "$DEBEZIUM_PLUGINS/debezium-postgres"
  # The worker's own slf4j binding serves the plugin too: one copy of the API.
  rm -f "$DEBEZIUM_PLUGINS"/debezium-postgres/slf4j-api-*.jar
  mkdir -p "$DEBEZIUM_DIR/data"
  sed -e "s|@KAFKA_PORT@|$KAFKA_PORT|g" -e "s|@CONNECT_PORT@|$CONNECT_PORT|g" \
    -e "s|@DATA_DIR@|$DEBEZIUM_DIR/data|g" -e "s|@PLUGIN_DIR@|$DEBEZIUM_PLUGINS|g" \
    "$HERE/debezium/worker.properties.in" >"$DEBEZIUM_DIR/worker.properties"
  local from
  from=$(log_size "$DEBEZIUM_DIR/connect.log")
  setsid nohup java -Xms128m -Xmx512m -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/debezium/log4j2.properties" \
    -Dconnect.log.file="$DEBEZIUM_DIR/connect.log" \
    -cp "$CONNECT_LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$DEBEZIUM_DIR/worker.properties" >"$DEBEZIUM_DIR/stdout.log" 2>&1 </dev/null &
  echo $! >"$DEBEZIUM_DIR/connect.pid"
  FATAL='Stopping due to error|Failed to start' FATAL_FROM=$from \
    wait_for debezium "$DEBEZIUM_DIR/connect.log" connect_ready
  say "debezium (Kafka Connect $KAFKA_VERSION, Debezium $DEBEZIUM_VERSION) up on 127.0.0.1:$CONNECT_PORT"
}

debezium_stop() {
  pid_alive "$DEBEZIUM_DIR/connect.pid" || return 0
  stop_pid debezium "$DEBEZIUM_DIR/connect.pid"
  say "debezium stopped"
}

debezium_status() { pid_alive "$DEBEZIUM_DIR/connect.pid" && connect_ready; }
