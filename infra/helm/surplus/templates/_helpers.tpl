{{/* Names, labels and the pieces every Surplus pod shares (image, Kafka, signing key). */}}

{{- define "surplus.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "surplus.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "surplus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "surplus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: surplus
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "control-plane"). */}}
{{- define "surplus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "surplus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "surplus.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A worker's image, with torch: pass (dict "root" $ "variant" "cpu"|"cuda"). */}}
{{- define "surplus.workerImage" -}}
{{- $image := .root.Values.workers.image }}
{{- $repository := get $image.repository .variant }}
{{- if not $repository }}
{{- fail (printf "workers.image.repository.%s: no image for the %s variant" .variant .variant) }}
{{- end }}
{{- $repository }}:{{ $image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{- define "surplus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "surplus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* SURPLUS_KAFKA_* from the chart's ConfigMap, credentials from the referenced Secret. */}}
{{- define "surplus.kafkaEnvFrom" -}}
- configMapRef:
    name: {{ include "surplus.fullname" . }}-kafka
{{- with .Values.kafka.credentialsSecret }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end }}

{{- define "surplus.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SURPLUS_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: HOME
  value: /tmp
{{- end }}

{{- define "surplus.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- with .Values.kafka.tls.secret }}
- name: kafka-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- with .Values.signingKey.secret }}
- name: signing-key
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.signingKey.key }}
        path: key
{{- end }}
{{- end }}

{{- define "surplus.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.secret }}
- name: kafka-tls
  mountPath: /etc/surplus/kafka-tls
  readOnly: true
{{- end }}
{{- if .Values.signingKey.secret }}
- name: signing-key
  mountPath: /etc/surplus/signing
  readOnly: true
{{- end }}
{{- end }}

{{/* SURPLUS_KAFKA_* as a YAML map: the ConfigMap's data, and the topics hook's env (a
pre-install hook runs before the release's ConfigMaps exist). */}}
{{- define "surplus.kafkaSettings" -}}
SURPLUS_KAFKA_BOOTSTRAP: {{ required "kafka.bootstrap is required" .Values.kafka.bootstrap | quote }}
SURPLUS_KAFKA_PREFIX: {{ .Values.kafka.prefix | quote }}
SURPLUS_KAFKA_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.saslMechanism }}
SURPLUS_KAFKA_SASL_MECHANISM: {{ . | quote }}
{{- end }}
{{- if .Values.kafka.tls.secret }}
SURPLUS_KAFKA_SSL_CAFILE: /etc/surplus/kafka-tls/ca.crt
{{- if .Values.kafka.tls.mutual }}
SURPLUS_KAFKA_SSL_CERTFILE: /etc/surplus/kafka-tls/tls.crt
SURPLUS_KAFKA_SSL_KEYFILE: /etc/surplus/kafka-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/*
The capacity agent beside one pool's worker (a container spec; the caller adds
restartPolicy: Always for a native sidecar). Args: root, pool (the workers.pools entry),
grace (the pod's grace period), gpus (the pool's nvidia.com/gpu limit, or nil).
*/}}
{{- define "surplus.capacityAgent" -}}
{{- $ := .root }}
{{- $w := $.Values.workers }}
{{- $agent := $w.capacityAgent -}}
- name: capacity-agent
  image: {{ include "surplus.image" $ }}
  imagePullPolicy: {{ $.Values.image.pullPolicy }}
  command: ["surplus"]
  args: ["capacity-agent"]
  env:
    {{- include "surplus.commonEnv" $ | nindent 4 }}
    - name: SURPLUS_CAPACITY_AGENT_WORKER_ID
      value: "$(POD_NAME)"
    - name: SURPLUS_CAPACITY_AGENT_POOL
      value: {{ .pool.pool | quote }}
    {{- with $agent.sources }}
    - name: SURPLUS_CAPACITY_AGENT_SOURCE
      value: {{ join " " . | quote }}
    {{- end }}
    - name: SURPLUS_CAPACITY_AGENT_GRACE_S
      value: {{ .grace | quote }}
    - name: SURPLUS_CAPACITY_AGENT_HOOK_PORT
      value: {{ $agent.hookPort | quote }}
    # the worker's /readyz gates the grant; each notice goes straight to it too
    - name: SURPLUS_CAPACITY_AGENT_WORKER_URL
      value: "http://127.0.0.1:{{ $w.port }}"
    - name: SURPLUS_CAPACITY_AGENT_CPU_LIMIT_FILE
      value: /etc/surplus/pod/worker-cpu-limit
    - name: SURPLUS_CAPACITY_AGENT_LABELS_FILE
      value: "/etc/surplus/pod/labels /etc/surplus/pod/annotations"
    {{- $units := .gpus | default $agent.acceleratorUnits }}
    {{- if not (kindIs "invalid" $units) }}
    # the GPUs the device plugin gave the worker, which a sidecar does not see
    - name: SURPLUS_CAPACITY_AGENT_ACCELERATOR_UNITS
      value: {{ $units | quote }}
    {{- end }}
    {{- if not (kindIs "invalid" $agent.cpuUnits) }}
    - name: SURPLUS_CAPACITY_AGENT_CPU_UNITS
      value: {{ $agent.cpuUnits | quote }}
    {{- end }}
    - name: SURPLUS_CAPACITY_AGENT_LEASE_S
      value: {{ $agent.leaseSeconds | quote }}
    - name: SURPLUS_CAPACITY_AGENT_RENEW_S
      value: {{ $agent.renewSeconds | quote }}
    - name: SURPLUS_CAPACITY_AGENT_ON_REBALANCE
      value: {{ $agent.onRebalance | quote }}
    - name: SURPLUS_CAPACITY_AGENT_LOGLEVEL
      value: {{ $agent.logLevel | quote }}
    {{- if $.Values.signingKey.secret }}
    # With a signing key the control plane refuses unsigned grants: the agent signs them.
    - name: SURPLUS_CAPACITY_AGENT_SIGNING_KEY_FILE
      value: /etc/surplus/signing/key
    {{- end }}
  envFrom:
    {{- include "surplus.kafkaEnvFrom" $ | nindent 4 }}
  resources:
    {{- toYaml $agent.resources | nindent 4 }}
  securityContext:
    {{- toYaml $.Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "surplus.commonVolumeMounts" $ | nindent 4 }}
    - name: pod-info
      mountPath: /etc/surplus/pod
      readOnly: true
{{- end }}

{{/*
A PodDisruptionBudget's spec from values, checked: pass (dict "key" "controlPlane.podDisruptionBudget"
"spec" .Values.controlPlane.podDisruptionBudget). Values merge into the chart's defaults, so
overriding maxUnavailable with minAvailable needs maxUnavailable: null.
*/}}
{{- define "surplus.disruptionBudget" -}}
{{- if ne (len (pick .spec "minAvailable" "maxUnavailable")) 1 }}
{{- fail (printf "%s: say one of minAvailable and maxUnavailable (null the other: values merge into the chart's defaults)" .key) }}
{{- end }}
{{- toYaml .spec }}
{{- end }}
