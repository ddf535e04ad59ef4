#!/bin/sh
# Configures and starts a single KRaft node the way the apache/kafka image does: each
# KAFKA_<NAME> variable becomes the broker property <name> ('_' -> '.', '__' -> '_',
# '___' -> '-'), except the launcher's own KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS (the
# collector: G1 with a 20 ms pause goal unless set, as Kafka's own start script and the embedded
# broker, surplus/localkafka.py BROKER_GC, use), KAFKA_OPTS and KAFKA_JVM_OPTS.
# CLUSTER_ID (default: a fixed one) formats the storage in log.dirs on the first start.
set -eu
config=/opt/kafka/config/server.properties
mkdir -p /opt/kafka/config
: >"$config"
env | sort | while IFS='=' read -r name value; do
  case $name in
    KAFKA_HEAP_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_OPTS|KAFKA_JVM_OPTS|KAFKA_VERSION) ;;
    KAFKA_*)
      key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' \
        | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
      printf '%s=%s\n' "$key" "$value" >>"$config" ;;
  esac
done
grep -q '^log.dirs=' "$config" || echo "log.dirs=/var/lib/kafka/data" >>"$config"
log4j="-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties"
# shellcheck disable=SC2086
java -cp '/opt/kafka/libs/*' $log4j kafka.tools.StorageTool format --ignore-formatted \
  -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$config" >/dev/null
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20} -Djava.awt.headless=true \
  ${KAFKA_JVM_OPTS:-} ${KAFKA_OPTS:-} $log4j -cp '/opt/kafka/libs/*' kafka.Kafka "$config"
