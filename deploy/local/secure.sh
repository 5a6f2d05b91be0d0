# The local stack's secured mode, sourced by deploy/local/stack: PostgreSQL, Redis and
# Kafka as a platform team runs them, on loopback, on ports of their own beside the
# plaintext stack.
#
# - A CA and a certificate per server (127.0.0.1 and localhost; CN inorder-postgres,
#   -redis, -kafka, -oidc), made with openssl at first start. Kafka's has client use
#   too: brokers present it to their controllers, and only its name is a super user.
# - PostgreSQL: ssl = on, password authentication (scram-sha-256) over TLS only; a role
#   per program. The superuser logs in only through a socket in a folder of its own.
# - Redis: a TLS port only (the plain port is closed), the default user off, an ACL user
#   per program.
# - Kafka: a SASL_SSL listener only (SCRAM-SHA-512), ACLs on (StandardAuthorizer, no
#   ACL means no access), a SCRAM principal per program; the controller listener takes
#   only the broker's certificate (mutual TLS). A second SASL_SSL listener takes
#   OAUTHBEARER tokens, signed by:
# - an OIDC token issuer (oidc-issuer.py, HTTPS): each program's client id and secret buy
#   a token whose subject is its principal, so the same ACLs apply.
#
# Every password is made once at random and ends in the characters a URL reserves, so
# every program meets a password that must be percent-encoded; they are kept in
# credentials.env (mode 600) and never put on a command line (psql reads them on stdin,
# redis-cli from REDISCLI_AUTH, Kafka's storage tool from a file only its owner reads).
# `stack env --secure` prints what the programs need.

SECURE_DIR=$STATE/secure
PG_SECURE_PORT=${INORDER_PG_SECURE_PORT:-15442}
REDIS_SECURE_PORT=${INORDER_REDIS_SECURE_PORT:-16389}
KAFKA_SECURE_PORT=${INORDER_KAFKA_SECURE_PORT:-19192}
KAFKA_SECURE_CONTROLLER_PORT=${INORDER_KAFKA_SECURE_CONTROLLER_PORT:-19193}
KAFKA_OAUTH_PORT=${INORDER_KAFKA_OAUTH_PORT:-19196}
OIDC_PORT=${INORDER_OIDC_PORT:-19197}
# The programs that get their own credentials; `owner` runs migrations and grants, and
# `super` is Kafka's and Redis's administrator (topics, ACLs), never a program's.
SECURE_PRINCIPALS=(owner producer relay consumer sweeper admin worker super)
SECURE_SERVICES=(postgres_secure redis_secure oidc_secure kafka_secure)
# What a program's Redis user may run on its keys: reads, writes and scripts (parking is
# Lua), nothing dangerous or administrative (no CONFIG, KEYS, FLUSHALL, DEBUG), the INFO
# and TIME that the durability check and the park scripts read, and in a cluster the
# slot map the client routes by (CLUSTER SLOTS, SHARDS, NODES).
REDIS_PROGRAM_COMMANDS="+@read +@write +@scripting +@connection +@transaction -@dangerous -@admin +info +time +cluster|slots +cluster|shards +cluster|nodes"
PG_SECURE_DIR=$(dirname "$PG_DIR")/postgres-secure
REDIS_SECURE_DIR=$SECURE_DIR/redis
KAFKA_SECURE_DIR=$SECURE_DIR/kafka
CERTS=$SECURE_DIR/certs
OIDC_DIR=$SECURE_DIR/oidc

# ---------------------------------------------------------------- credentials and certs

# Made once; a principal added later gets its password beside the others'.
secure_credentials() {
  mkdir -p "$SECURE_DIR"
  local name
  (
    umask 077
    touch "$SECURE_DIR/credentials.env"
    for name in "${SECURE_PRINCIPALS[@]}"; do
      grep -q "^${name^^}_PASSWORD=" "$SECURE_DIR/credentials.env" && continue
      printf '%s_PASSWORD=%s\n' "${name^^}" "$(openssl rand -hex 12)-%/#@?"
    done >>"$SECURE_DIR/credentials.env"
  )
}

# password NAME: the password of one principal.
password() { sed -n "s/^${1^^}_PASSWORD=//p" "$SECURE_DIR/credentials.env"; }
# encoded NAME: its password percent-encoded for a URL.
encoded() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$(password "$1")"; }

# The servers that present a certificate, each its own (a key that leaks from one
# cannot pose as another): PostgreSQL, Redis, Kafka (its listeners, and the controllers'
# mutual TLS, whose name alone is a Kafka super user) and the OIDC issuer.
SERVER_CERTS=(postgres redis kafka oidc)

# server_cert NAME: CERTS/NAME.pem and NAME.key (and NAME-keystore.pem, key then
# certificate) for 127.0.0.1 and localhost, CN inorder-NAME, signed by the stack's CA.
server_cert() {
  [ -f "$CERTS/$1.pem" ] && return 0
  (
    umask 077
    cd "$CERTS"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1.key" >/dev/null 2>&1
    openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=inorder-$1" >/dev/null 2>&1
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
      "extendedKeyUsage=serverAuth,clientAuth" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile "$1.ext" -out "$1.pem" >/dev/null 2>&1
    cat "$1.key" "$1.pem" >"$1-keystore.pem"
    rm -f "$1.csr" "$1.ext"
  ) || die "openssl could not make the $1 certificate in $CERTS"
  chmod 644 "$CERTS/$1.pem"
}

secure_certs() {
  mkdir -p "$CERTS"
  if [ ! -f "$CERTS/ca.pem" ]; then
    say "making a CA in $CERTS"
    (
      umask 077
      cd "$CERTS"
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
        -subj "/CN=inorder local CA" >/dev/null 2>&1
    ) || die "openssl could not make the CA in $CERTS"
    chmod 644 "$CERTS/ca.pem"
  fi
  local name
  for name in "${SERVER_CERTS[@]}"; do server_cert "$name"; done
  rm -f "$CERTS"/server.{pem,key,csr,ext} "$CERTS/server-keystore.pem"  # the one for all
}

# ---------------------------------------------------------------- postgres

pg_secure_ready() {
  as_pg psql -h "$PG_SECURE_DIR/run" -p "$PG_SECURE_PORT" -U postgres -d "$1" -tAc 'select 1' \
    2>/dev/null | grep -q 1
}
pg_secure_sql() { as_pg psql -h "$PG_SECURE_DIR/run" -p "$PG_SECURE_PORT" -U postgres -v ON_ERROR_STOP=1 -q "$@"; }

postgres_secure_start() {
  if pid_alive "$PG_SECURE_DIR/data/postmaster.pid" && pg_secure_ready "$PG_DB"; then
    say "postgres (secure) already running on 127.0.0.1:$PG_SECURE_PORT"; return 0
  fi
  refuse_foreign pg_secure "$PG_SECURE_PORT" "$PG_SECURE_DIR/data/postmaster.pid"
  secure_credentials
  secure_certs
  local bin; bin=$(pg_bin)
  mkdir -p "$PG_SECURE_DIR/run" "$PG_SECURE_DIR/tls"
  cp "$CERTS/postgres.pem" "$CERTS/postgres.key" "$CERTS/ca.pem" "$PG_SECURE_DIR/tls/"
  chmod 700 "$PG_SECURE_DIR/run"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$PG_SECURE_DIR"
  chmod 600 "$PG_SECURE_DIR/tls/postgres.key"
  if [ ! -f "$PG_SECURE_DIR/data/PG_VERSION" ]; then
    say "initdb $PG_SECURE_DIR/data"
    as_pg "$bin/initdb" -D "$PG_SECURE_DIR/data" -U postgres --auth-local=trust \
      --auth-host=reject -E UTF8 --locale=C.UTF-8 >"$PG_SECURE_DIR/initdb.log" 2>&1 \
      || die "initdb failed, see $PG_SECURE_DIR/initdb.log"
    # The superuser only through the private socket; everyone else with a password over
    # TLS; nothing in clear.
    as_pg sh -c "printf '%s\n' 'local all postgres trust' \
      'hostssl all all 127.0.0.1/32 scram-sha-256' 'host all all 0.0.0.0/0 reject' \
      >'$PG_SECURE_DIR/data/pg_hba.conf'"
  fi
  as_pg "$bin/pg_ctl" -D "$PG_SECURE_DIR/data" -l "$PG_SECURE_DIR/server.log" -w -t "$WAIT_S" \
    -o "-p $PG_SECURE_PORT -k $PG_SECURE_DIR/run -c listen_addresses=127.0.0.1 \
       -c max_connections=100 -c ssl=on -c ssl_cert_file=$PG_SECURE_DIR/tls/postgres.pem \
       -c ssl_key_file=$PG_SECURE_DIR/tls/postgres.key -c ssl_ca_file=$PG_SECURE_DIR/tls/ca.pem \
       -c password_encryption=scram-sha-256" \
    start >/dev/null || die "postgres (secure) did not start; its log is $PG_SECURE_DIR/server.log"
  wait_for postgres_secure "$PG_SECURE_DIR/server.log" pg_secure_ready postgres
  postgres_secure_roles
  say "postgres (secure) up on 127.0.0.1:$PG_SECURE_PORT (TLS, scram-sha-256)"
}

# program_roles: every program's role, comma-separated (not the owner's).
program_roles() {
  local name out=()
  for name in "${SECURE_PRINCIPALS[@]}"; do
    case $name in owner|super) ;; *) out+=("inorder_$name") ;; esac
  done
  (IFS=,; echo "${out[*]}")
}

# A login role per program, each with its password; the database and its public schema
# belong to the owner, and no one else may create in them. Grants on the tables follow
# the migrations (inorder-admin grants).
postgres_secure_roles() {
  local name sql=""
  for name in "${SECURE_PRINCIPALS[@]}"; do
    [ "$name" = super ] && continue
    sql+="DO \$\$ BEGIN CREATE ROLE inorder_$name LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END \$\$;"
    sql+="ALTER ROLE inorder_$name PASSWORD '$(password "$name" | sed "s/'/''/g")';"
  done
  pg_secure_sql -d postgres <<<"$sql"  # on stdin: passwords stay off command lines
  if ! pg_secure_ready "$PG_DB"; then
    pg_secure_sql -d postgres -c "CREATE DATABASE $PG_DB OWNER inorder_owner"
  fi
  pg_secure_sql -d "$PG_DB" -c "ALTER SCHEMA public OWNER TO inorder_owner; \
    REVOKE ALL ON SCHEMA public FROM PUBLIC; REVOKE ALL ON DATABASE $PG_DB FROM PUBLIC; \
    GRANT CONNECT ON DATABASE $PG_DB TO $(program_roles)"
}

postgres_secure_stop() {
  [ -f "$PG_SECURE_DIR/data/postmaster.pid" ] || return 0
  as_pg "$(pg_bin)/pg_ctl" -D "$PG_SECURE_DIR/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
  say "postgres (secure) stopped"
}

postgres_secure_status() { pid_alive "$PG_SECURE_DIR/data/postmaster.pid" && pg_secure_ready "$PG_DB"; }

# ---------------------------------------------------------------- redis

redis_secure_cli() {
  REDISCLI_AUTH=$(password super) redis-cli --tls --cacert "$CERTS/ca.pem" -h 127.0.0.1 \
    -p "$REDIS_SECURE_PORT" --user inorder-super "$@"
}
redis_secure_ready() { [ "$(redis_secure_cli ping 2>/dev/null)" = PONG ]; }

# redis.conf lines: TLS on PORT only (the plain port is set to 0 apart).
redis_tls_settings() {
  printf '%s\n' "tls-port $1" "tls-cert-file $CERTS/redis.pem" "tls-key-file $CERTS/redis.key" \
    "tls-ca-cert-file $CERTS/ca.pem" "tls-auth-clients no"
}

# redis.conf lines: the default user off, the administrator, and a user per program.
redis_acl_users() {
  local name
  echo "user default off"
  echo "user inorder-super on >$(password super) ~* &* +@all"
  for name in consumer sweeper admin; do
    echo "user inorder-$name on >$(password "$name") ~inorder:* resetchannels -@all $REDIS_PROGRAM_COMMANDS"
  done
}

redis_secure_start() {
  if pid_alive "$REDIS_SECURE_DIR/redis.pid" && redis_secure_ready; then
    say "redis (secure) already running on 127.0.0.1:$REDIS_SECURE_PORT"; return 0
  fi
  refuse_foreign redis_secure "$REDIS_SECURE_PORT" "$REDIS_SECURE_DIR/redis.pid"
  secure_credentials
  secure_certs
  mkdir -p "$REDIS_SECURE_DIR/data"
  # Parks live under the consumers' key prefix (inorder:); each program gets the commands
  # its work needs and no more (INFO for the durability check, no CONFIG, no KEYS).
  (
    umask 077
    sed -e "s|@REDIS_PORT@|0|g" -e "s|@STATE_DIR@|$REDIS_SECURE_DIR|g" "$HERE/redis.conf.in"
    redis_tls_settings "$REDIS_SECURE_PORT"
    redis_acl_users
  ) >"$REDIS_SECURE_DIR/redis.conf"
  local from; from=$(log_size "$REDIS_SECURE_DIR/redis.log")
  redis-server "$REDIS_SECURE_DIR/redis.conf" \
    || die "redis (secure) did not start; its log is $REDIS_SECURE_DIR/redis.log"
  FATAL=$REDIS_FATAL FATAL_FROM=$from wait_for redis_secure "$REDIS_SECURE_DIR/redis.log" redis_secure_ready
  say "redis (secure) up on 127.0.0.1:$REDIS_SECURE_PORT (TLS only, ACL users)"
}

redis_secure_stop() {
  pid_alive "$REDIS_SECURE_DIR/redis.pid" || return 0
  stop_pid redis_secure "$REDIS_SECURE_DIR/redis.pid"
  say "redis (secure) stopped"
}

redis_secure_status() { pid_alive "$REDIS_SECURE_DIR/redis.pid" && redis_secure_ready; }

# ---------------------------------------------------------------- oidc

# The issuer's signing key, its clients (inorder-<program>=<password>) and the JWKS file
# the broker reads: made before Kafka starts, whether or not the issuer runs.
oidc_keys() {
  mkdir -p "$OIDC_DIR"
  (
    umask 077
    [ -f "$OIDC_DIR/signing.key" ] || openssl genpkey -algorithm RSA \
      -pkeyopt rsa_keygen_bits:2048 -out "$OIDC_DIR/signing.key" >/dev/null 2>&1 \
      || die "openssl could not make the OIDC signing key"
    local name
    for name in "${SECURE_PRINCIPALS[@]}"; do
      printf 'inorder-%s=%s\n' "$name" "$(password "$name")"
    done >"$OIDC_DIR/clients"
  )
  oidc_issuer --jwks-only || die "the OIDC issuer could not write $OIDC_DIR/jwks.json"
}

OIDC_ARGS=(--port "$OIDC_PORT" --cert "$CERTS/oidc-keystore.pem" --signing-key
  "$OIDC_DIR/signing.key" --clients "$OIDC_DIR/clients" --jwks-out "$OIDC_DIR/jwks.json")
# Debian's python3, whose python3-jwt and python3-cryptography the stack installs.
oidc_issuer() { /usr/bin/python3 "$HERE/oidc-issuer.py" "${OIDC_ARGS[@]}" "$@"; }

oidc_secure_ready() {
  curl -sf --cacert "$CERTS/ca.pem" "https://127.0.0.1:$OIDC_PORT/.well-known/openid-configuration" \
    >/dev/null 2>&1
}

oidc_secure_start() {
  if pid_alive "$OIDC_DIR/oidc.pid" && oidc_secure_ready; then
    say "oidc issuer (secure) already running on https://127.0.0.1:$OIDC_PORT"; return 0
  fi
  refuse_foreign oidc_secure "$OIDC_PORT" "$OIDC_DIR/oidc.pid"
  secure_credentials
  secure_certs
  oidc_keys
  setsid nohup /usr/bin/python3 "$HERE/oidc-issuer.py" "${OIDC_ARGS[@]}" >>"$OIDC_DIR/oidc.log" 2>&1 \
    </dev/null &
  echo $! >"$OIDC_DIR/oidc.pid"
  wait_for oidc_secure "$OIDC_DIR/oidc.log" oidc_secure_ready
  say "oidc issuer (secure) up on https://127.0.0.1:$OIDC_PORT (client credentials, RS256)"
}

oidc_secure_stop() {
  pid_alive "$OIDC_DIR/oidc.pid" || return 0
  stop_pid oidc_secure "$OIDC_DIR/oidc.pid"
  say "oidc issuer (secure) stopped"
}

oidc_secure_status() { pid_alive "$OIDC_DIR/oidc.pid" && oidc_secure_ready; }

# ---------------------------------------------------------------- kafka

# The brokers' login to each other (the super principal), a line of server.properties.
kafka_inter_broker_login() {
  printf 'listener.name.secure.scram-sha-512.sasl.jaas.config=%s\n' \
    "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"inorder-super\" password=\"$(password super)\";"
}

# StorageTool's --add-scram arguments, one per line: a SCRAM principal per program.
scram_arguments() {
  local name
  for name in "${SECURE_PRINCIPALS[@]}"; do
    printf '%s\n' --add-scram "SCRAM-SHA-512=[name=inorder-$name,password=\"$(password "$name")\"]"
  done
}

# scram_file DIR: those arguments in DIR/scram.args (only its owner reads it), for
# StorageTool to read as @DIR/scram.args: the passwords stay off command lines.
scram_file() {
  (umask 077 && scram_arguments >"$1/scram.args")
  echo "@$1/scram.args"
}

# Started: the broker says so in its log, and its SASL_SSL port answers TLS with our CA.
# (Debian's kcat fails every SCRAM-SHA-512 login, so it cannot be the check here.)
# secure_broker_up LOG FROM PORT: LOG says the broker started, past its first FROM bytes,
# and PORT answers TLS with the stack's CA. The secured single node and cluster both wait
# on it.
secure_broker_up() {
  grep -q 'Kafka Server started' <<<"$(since "$2" "$1")" \
    && openssl s_client -connect "127.0.0.1:$3" -CAfile "$CERTS/ca.pem" -verify_return_error \
      </dev/null >/dev/null 2>&1
}

kafka_secure_ready() {
  port_open "$KAFKA_SECURE_PORT" && secure_broker_up "$KAFKA_SECURE_DIR/logs/server.log" \
    "${KAFKA_SECURE_FROM:-0}" "$KAFKA_SECURE_PORT"
}

kafka_secure_start() {
  if pid_alive "$KAFKA_SECURE_DIR/kafka.pid" && kafka_secure_ready >/dev/null 2>&1; then
    say "kafka (secure) already running on 127.0.0.1:$KAFKA_SECURE_PORT"; return 0
  fi
  refuse_foreign kafka_secure "$KAFKA_SECURE_PORT" "$KAFKA_SECURE_DIR/kafka.pid"
  refuse_foreign kafka_secure_controller "$KAFKA_SECURE_CONTROLLER_PORT" "$KAFKA_SECURE_DIR/kafka.pid"
  secure_credentials
  secure_certs
  oidc_keys
  ensure_kafka_jars
  mkdir -p "$KAFKA_SECURE_DIR/data" "$KAFKA_SECURE_DIR/logs"
  (
    umask 077
    sed -e "s|@KAFKA_PORT@|$KAFKA_SECURE_PORT|g" \
      -e "s|@CONTROLLER_PORT@|$KAFKA_SECURE_CONTROLLER_PORT|g" \
      -e "s|@DATA_DIR@|$KAFKA_SECURE_DIR/data|g" -e "s|@CERTS@|$CERTS|g" \
      -e "s|@MORE_LISTENERS@|OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT,|g" \
      -e "s|@MORE_ADVERTISED@|,OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT|g" \
      -e "s|@MORE_PROTOCOLS@|OAUTH:SASL_SSL,|g" \
      -e "s|@JWKS@|$OIDC_DIR/jwks.json|g" -e "s|@ISSUER@|https://127.0.0.1:$OIDC_PORT|g" \
      "$HERE/kafka/secure.properties.in" "$HERE/kafka/security.properties.in" \
      "$HERE/kafka/oauth.properties.in"
    kafka_inter_broker_login
  ) >"$KAFKA_SECURE_DIR/server.properties"
  # SCRAM principals are written when the storage is formatted: storage formatted for
  # other principals (an older stack) is formatted again. It holds only test topics.
  if [ "$(cat "$KAFKA_SECURE_DIR/principals" 2>/dev/null)" != "${SECURE_PRINCIPALS[*]}" ]; then
    rm -rf "$KAFKA_SECURE_DIR/data" && mkdir -p "$KAFKA_SECURE_DIR/data"
  fi
  if [ ! -f "$KAFKA_SECURE_DIR/data/meta.properties" ]; then
    local cluster_id scram
    cluster_id=$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    scram=$(scram_file "$KAFKA_SECURE_DIR")
    say "formatting Kafka (secure) storage with a SCRAM principal per program"
    kafka_java -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
      -Dkafka.logs.dir="$KAFKA_SECURE_DIR/logs" kafka.tools.StorageTool format --standalone \
      -t "$cluster_id" -c "$KAFKA_SECURE_DIR/server.properties" "$scram" \
      >"$KAFKA_SECURE_DIR/logs/format.log" 2>&1 \
      || die "Kafka (secure) storage format failed, see $KAFKA_SECURE_DIR/logs/format.log"
    rm -f "$KAFKA_SECURE_DIR/scram.args"
    echo "${SECURE_PRINCIPALS[*]}" >"$KAFKA_SECURE_DIR/principals"
  fi
  KAFKA_SECURE_FROM=$(log_size "$KAFKA_SECURE_DIR/logs/server.log")
  setsid nohup java -Xms512m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dorg.apache.kafka.sasl.oauthbearer.allowed.urls="file://$OIDC_DIR/jwks.json" \
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" -Dkafka.logs.dir="$KAFKA_SECURE_DIR/logs" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_SECURE_DIR/server.properties" \
    >"$KAFKA_SECURE_DIR/logs/stdout.log" 2>&1 </dev/null &
  echo $! >"$KAFKA_SECURE_DIR/kafka.pid"
  wait_for kafka_secure "$KAFKA_SECURE_DIR/logs/server.log" kafka_secure_ready
  say "kafka (secure) up on 127.0.0.1:$KAFKA_SECURE_PORT (SASL_SSL, SCRAM-SHA-512, ACLs on) and $KAFKA_OAUTH_PORT (OAUTHBEARER)"
}

kafka_secure_stop() {
  pid_alive "$KAFKA_SECURE_DIR/kafka.pid" || return 0
  stop_pid kafka_secure "$KAFKA_SECURE_DIR/kafka.pid"
  say "kafka (secure) stopped"
}

kafka_secure_status() { pid_alive "$KAFKA_SECURE_DIR/kafka.pid" && kafka_secure_ready >/dev/null 2>&1; }

# ---------------------------------------------------------------- env

# What the programs need, as shell exports: the CA, Kafka's address and protocol, and
# for each principal its PostgreSQL URL, Redis URL and Kafka user and password.
# REDIS_HOSTS and KAFKA_BOOTSTRAP, when set, are the cluster's (secure_cluster_env).
secure_env() {
  local name pg redis
  cat <<EOF
export INORDER_SECURE_CA=$CERTS/ca.pem
export INORDER_SECURE_KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:$KAFKA_SECURE_PORT}
export INORDER_SECURE_PG_PORT=$PG_SECURE_PORT
export INORDER_SECURE_REDIS_PORT=$REDIS_SECURE_PORT
export INORDER_SECURE_KAFKA_PORT=$KAFKA_SECURE_PORT
export INORDER_SECURE_KAFKA_CONTROLLER_PORT=$KAFKA_SECURE_CONTROLLER_PORT
export INORDER_SECURE_PG_SOCKET=$PG_SECURE_DIR/run
export INORDER_SECURE_KAFKA_OAUTH_BOOTSTRAP=127.0.0.1:$KAFKA_OAUTH_PORT
export INORDER_SECURE_OIDC_TOKEN_URL=https://127.0.0.1:$OIDC_PORT/token
EOF
  for name in "${SECURE_PRINCIPALS[@]}"; do
    pg="postgresql://inorder_$name:$(encoded "$name")@127.0.0.1:$PG_SECURE_PORT/$PG_DB"
    pg+="?sslmode=verify-full&sslrootcert=$CERTS/ca.pem"
    redis="rediss://inorder-$name:$(encoded "$name")@${REDIS_HOSTS:-127.0.0.1:$REDIS_SECURE_PORT}/0"
    redis+="?ssl_ca_certs=$CERTS/ca.pem"
    printf "export INORDER_SECURE_DATABASE_URL_%s='%s'\n" "${name^^}" "$pg"
    printf "export INORDER_SECURE_REDIS_URL_%s='%s'\n" "${name^^}" "$redis"
    printf "export INORDER_SECURE_KAFKA_USER_%s='%s'\n" "${name^^}" "inorder-$name"
    printf "export INORDER_SECURE_KAFKA_PASSWORD_%s='%s'\n" "${name^^}" "$(password "$name")"
  done
}
