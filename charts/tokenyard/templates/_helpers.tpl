{{/*
Shared helpers. Every object is named <release>-<component> (the router templates write the same by hand) and
selected by app.kubernetes.io/instance + app.kubernetes.io/component.
*/}}

{{/* The name of one component's objects: (dict "root" $ "component" "operator"). */}}
{{- define "tokenyard.componentName" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* chart label value: name-version, as Helm's own scaffold writes it. */}}
{{- define "tokenyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The labels that select one component's pods (stable across upgrades: never add to them). */}}
{{- define "tokenyard.selectorLabels" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every object's labels: (dict "root" $ "component" "operator"). */}}
{{- define "tokenyard.labels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
{{ include "tokenyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tokenyard
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "tokenyard.chart" .root }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The container image and pull policy of a component: (dict "root" $ "image" .Values.<component>.image).
The component's `image` may be empty (use the shared `image`), a string "repository:tag", or a map whose keys
override the shared `image`. The tag defaults to the chart's appVersion.
*/}}
{{- define "tokenyard.image" -}}
{{- $shared := .root.Values.image | default dict -}}
{{- $override := .image -}}
{{- if kindIs "string" $override -}}
image: {{ $override | quote }}
imagePullPolicy: {{ $shared.pullPolicy | default "IfNotPresent" }}
{{- else -}}
{{- $merged := mergeOverwrite (deepCopy $shared) ($override | default dict) -}}
{{- if not $merged.repository }}{{ fail "image.repository is empty: set image.repository (or <component>.image)" }}{{ end -}}
image: {{ printf "%s:%s" $merged.repository (toString ($merged.tag | default .root.Chart.AppVersion)) | quote }}
imagePullPolicy: {{ $merged.pullPolicy | default "IfNotPresent" }}
{{- end -}}
{{- end }}

{{/* Prometheus base URL of a component: (dict "root" $ "values" .Values.<component>). */}}
{{- define "tokenyard.prometheusUrl" -}}
{{- .values.prometheusUrl | default .root.Values.prometheusUrl -}}
{{- end }}

{{/* "true" when ServiceMonitors are wanted and the cluster can take them (empty otherwise). */}}
{{- define "tokenyard.serviceMonitorEnabled" -}}
{{- if and .Values.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") -}}
true
{{- end -}}
{{- end }}

{{/* "true" when PrometheusRules are wanted and the cluster can take them (empty otherwise). */}}
{{- define "tokenyard.prometheusRulesEnabled" -}}
{{- if and .Values.prometheusRules.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") -}}
true
{{- end -}}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------- operator */}}

{{- define "tokenyard.operator.name" -}}
{{- include "tokenyard.componentName" (dict "root" . "component" "operator") -}}
{{- end }}

{{- define "tokenyard.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- .Values.operator.serviceAccount.name | default (include "tokenyard.operator.name" .) -}}
{{- else -}}
{{- .Values.operator.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end }}

{{/* Whether the operator runs as peers (StatefulSet + Kopf peering) rather than standalone (Deployment). */}}
{{- define "tokenyard.operator.peering" -}}
{{- if .Values.operator.peering.enabled -}}
true
{{- end -}}
{{- end }}

{{/*
The operator's pod template, shared by its Deployment (standalone) and StatefulSet (peering).
*/}}
{{- define "tokenyard.operator.podTemplate" -}}
{{- $op := .Values.operator -}}
{{- $ctx := dict "root" . "component" "operator" -}}
metadata:
  labels:
    {{- include "tokenyard.labels" $ctx | nindent 4 }}
    {{- with $op.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- /* Restart the operator when its RBAC changes: a pod keeps the permissions it discovered at start-up. */}}
    checksum/rbac: {{ include (print .Template.BasePath "/operator-rbac.yaml") . | sha256sum }}
    {{- with $op.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "tokenyard.operator.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $op.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $op.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $op.podSecurityContext | nindent 4 }}
  {{- with $op.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $op.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- if $op.affinity }}
    {{- toYaml $op.affinity | nindent 4 }}
    {{- else }}
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "tokenyard.selectorLabels" $ctx | nindent 16 }}
    {{- end }}
  containers:
    - name: operator
      {{- include "tokenyard.image" (dict "root" . "image" $op.image) | nindent 6 }}
      # The image's console script (ENTRYPOINT ["tokenyard"]), spelled out so that an override image works too.
      command: ["tokenyard"]
      args:
        - operator
        - --metrics-host=0.0.0.0
        - --metrics-port={{ $op.metricsPort }}
        - --liveness=http://0.0.0.0:{{ $op.livenessPort }}/healthz
        {{- if include "tokenyard.operator.peering" . }}
        - --peering={{ $op.peering.name }}
        {{- /* Kubernetes expands $(VAR) in args: no shell needed in the image. */}}
        - --priority=$(TOKENYARD_PEERING_PRIORITY)
        {{- else }}
        - --standalone
        {{- end }}
        {{- range $op.watchNamespaces }}
        - --namespace={{ . }}
        {{- end }}
        {{- if $op.verbose }}
        - --verbose
        {{- end }}
        {{- range $op.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        # Kopf names this replica in the peering object after POD_ID (kopf/_core/engines/peering.py).
        - name: POD_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if include "tokenyard.operator.peering" . }}
        # The StatefulSet ordinal (0, 1, ...): distinct per replica and stable across restarts.
        - name: TOKENYARD_PEERING_PRIORITY
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        - name: TOKENYARD_PEERING_LIFETIME_SECONDS
          value: {{ $op.peering.lifetimeSeconds | default 60 | quote }}
        {{- end }}
        - name: TOKENYARD_RESYNC_SECONDS
          value: {{ $op.resyncSeconds | quote }}
        - name: TOKENYARD_BIND_TIMEOUT_SECONDS
          value: {{ $op.bindTimeoutSeconds | quote }}
        {{- with include "tokenyard.prometheusUrl" (dict "root" . "values" $op) }}
        - name: TOKENYARD_PROMETHEUS_URL
          value: {{ . | quote }}
        {{- end }}
        {{- if .Values.inferencePool.enabled }}
        {{- if not .Values.router.epp.enabled }}
        {{- fail "inferencePool.enabled needs router.epp.enabled: the pools name the router's epp Service port as their endpoint picker" }}
        {{- end }}
        # One InferencePool per ModelDeployment while the cluster serves that CRD, naming the router's epp port.
        - name: TOKENYARD_INFERENCE_POOL
          value: auto
        - name: TOKENYARD_EPP_SERVICE
          value: {{ include "tokenyard.componentName" (dict "root" . "component" "router") | quote }}
        - name: TOKENYARD_EPP_PORT
          value: {{ .Values.router.epp.port | quote }}
        - name: TOKENYARD_EPP_FAILURE_MODE
          value: {{ .Values.inferencePool.failureMode | default "FailClose" | quote }}
        {{- else }}
        # No InferencePools (and no RBAC for them): inferencePool.enabled is false.
        - name: TOKENYARD_INFERENCE_POOL
          value: "off"
        {{- end }}
        - name: PYTHONUNBUFFERED
          value: "1"
        - name: PYTHONDONTWRITEBYTECODE
          value: "1"
        {{- with $op.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: metrics
          containerPort: {{ $op.metricsPort }}
        - name: liveness
          containerPort: {{ $op.livenessPort }}
      # Kopf's liveness endpoint answers only while the operator's event loop and probes run. No readiness
      # probe: the operator serves no traffic, and a standby peer is healthy too.
      livenessProbe:
        httpGet:
          path: /healthz
          port: liveness
        initialDelaySeconds: 10
        periodSeconds: 15
        timeoutSeconds: 5
        failureThreshold: 4
      resources:
        {{- toYaml $op.resources | nindent 8 }}
      securityContext:
        {{- toYaml $op.securityContext | nindent 8 }}
      volumeMounts:
        # The root file system is read-only; Python and Kopf may still need a scratch directory.
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
{{- end }}
