{{/* Names and labels. */}}
{{- define "fleetllm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleetllm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fleetllm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetllm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetllm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fleetllm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* (dict "root" $ "component" "control-plane") */}}
{{- define "fleetllm.componentSelectorLabels" -}}
{{ include "fleetllm.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetllm.componentLabels" -}}
{{ include "fleetllm.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetllm.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the pods find things. */}}
{{- define "fleetllm.configPath" -}}/etc/fleetllm/control-plane.yaml{{- end -}}
{{- define "fleetllm.credentialsDir" -}}/run/credentials/fleetllm{{- end -}}
{{- define "fleetllm.tlsDir" -}}/etc/fleetllm-tls{{- end -}}
{{- define "fleetllm.port" -}}8080{{- end -}}
{{- define "fleetllm.portName" -}}{{ if .Values.tls.existingSecret }}https{{ else }}http{{ end }}{{- end -}}
{{- define "fleetllm.sqlite" -}}{{ if eq .Values.state.backend "sqlite" }}true{{ end }}{{- end -}}
{{- define "fleetllm.oidc" -}}{{ if .Values.auth.oidc.enabled }}true{{ end }}{{- end -}}

{{/* The roles' token lists: [values key, file name of the first (then -1, -2, ...), config key]. */}}
{{- define "fleetllm.tokenLists" -}}
{{- toJson (list (list "adminTokens" "admin-token" "admin_tokens") (list "operatorTokens" "operator-token" "operator_tokens") (list "viewerTokens" "viewer-token" "viewer_tokens")) -}}
{{- end -}}

{{/* The file name of token $i of a list: (list FIRST i). */}}
{{- define "fleetllm.tokenFile" -}}
{{- $first := index . 0 -}}{{- $i := index . 1 -}}
{{- ternary $first (printf "%s-%d" $first $i) (eq $i 0) -}}
{{- end -}}

{{/* auth.oidc.redirect_base: the value, or https://<ingress.host> ("" when neither; fleetllm.check fails). */}}
{{- define "fleetllm.redirectBase" -}}
{{- if .Values.auth.oidc.redirectBase -}}{{ .Values.auth.oidc.redirectBase }}
{{- else if .Values.ingress.enabled -}}{{ printf "https://%s" .Values.ingress.host }}
{{- end -}}
{{- end -}}

{{/*
Every credential the config uses, as JSON: [{name, secret, key, serveOnly, note}]. `name` is the file in
$CREDENTIALS_DIRECTORY and the config's ${cred:NAME}; serveOnly ones (the fleet key, the webhook secret,
the admin, operator and viewer tokens, the single sign-on client's secret:
fleetllm.job.configfile.SERVE_ONLY) are never mounted into a reconciler's pod. `note` says what it is in
the install notes ("" for the rest).
*/}}
{{- define "fleetllm.credentials" -}}
{{- $v := .Values -}}
{{- $refs := list
  (list "webhook-secret" $v.repository.webhookSecret true)
  (list "fleet-key" $v.secrets.fleetKey true)
  (list "vllm-api-salt" $v.secrets.vllmApiSalt false)
  (list "previous-vllm-api-salt" $v.secrets.previousVllmApiSalt false)
  (list "legacy-api-key" $v.secrets.legacyApiKey false)
-}}
{{- range $tokens := (include "fleetllm.tokenLists" . | fromJsonArray) -}}
{{- $role := index $tokens 1 | trimSuffix "-token" -}}
{{- range $i, $token := index $v (index $tokens 0) -}}
{{- $note := printf "%s token" $role -}}
{{- with $token.name }}{{ $note = printf "%s %s" $note . }}{{ end -}}
{{- $refs = append $refs (list (include "fleetllm.tokenFile" (list (index $tokens 1) $i)) (dict "secret" $token.secret "key" $token.key) true $note) -}}
{{- end -}}
{{- end -}}
{{- $refs = append $refs (list "metrics-token" $v.metricsToken false "the metrics token: GET /metrics, sent by the ServiceMonitor") -}}
{{- if include "fleetllm.oidc" . -}}
{{- $refs = append $refs (list "oidc-client-secret" $v.auth.oidc.clientSecret true "the single sign-on client's secret") -}}
{{- end -}}
{{- if eq $v.state.backend "postgresql" -}}
{{- $refs = append $refs (list "pg-password" $v.state.postgresql.password false) -}}
{{- end -}}
{{- if $v.litellm.url -}}
{{- $refs = append $refs (list "litellm-master-key" $v.litellm.masterKey false) -}}
{{- end -}}
{{- $refs = append $refs (list "vast-api-key" $v.providers.vast.apiKey false) -}}
{{- $refs = append $refs (list "runpod-api-key" $v.providers.runpod.apiKey false) -}}
{{- range $v.extraCredentials -}}
{{- $refs = append $refs (list .name (dict "secret" .secret "key" .key) false) -}}
{{- end -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- range $refs -}}
{{- $name := index . 0 -}}
{{- $ref := index . 1 | default dict -}}
{{- if $ref.key -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "extraCredentials: the name %q is taken (by the chart's own credentials or another entry): choose another" $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- $secret := default $v.existingSecret $ref.secret -}}
{{- if not $secret -}}
{{- fail (printf "credential %s (key %q): no Secret to read it from: set existingSecret, or `secret` in its entry" $name $ref.key) -}}
{{- end -}}
{{- $note := "" -}}
{{- if gt (len .) 3 }}{{ $note = index . 3 }}{{ end -}}
{{- $out = append $out (dict "name" $name "secret" $secret "key" $ref.key "serveOnly" (index . 2) "note" $note) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The control plane's config file (docs/configuration.md), read by every pod the chart runs. */}}
{{- define "fleetllm.config" -}}
{{- $v := .Values -}}
{{- $names := dict -}}
{{- range (include "fleetllm.credentials" . | fromJsonArray) -}}
{{- $_ := set $names .name (printf "${cred:%s}" .name) -}}
{{- end -}}
{{- $repo := dict "url" $v.repository.url "branch" $v.repository.branch "refresh_interval_s" $v.repository.refreshIntervalS "clone_dir" "/var/lib/fleetllm/fleet-repo.git" -}}
{{- with $v.repository.subdir }}{{ $_ := set $repo "subdir" . }}{{ end -}}
{{- with (get $names "webhook-secret") }}{{ $_ := set $repo "webhook_secret" . }}{{ end -}}
{{- $secrets := dict -}}
{{- range $field, $name := dict "fleet_key" "fleet-key" "vllm_api_salt" "vllm-api-salt" "previous_vllm_api_salt" "previous-vllm-api-salt" "legacy_api_key" "legacy-api-key" -}}
{{- with (get $names $name) }}{{ $_ := set $secrets $field . }}{{ end -}}
{{- end -}}
{{- $config := dict "repo" $repo "secrets" $secrets "listen" (printf "0.0.0.0:%s" (include "fleetllm.port" .)) -}}
{{- if $v.tls.existingSecret -}}
{{- $_ := set $config "tls" (dict "cert" (printf "%s/tls.crt" (include "fleetllm.tlsDir" .)) "key" (printf "%s/tls.key" (include "fleetllm.tlsDir" .))) -}}
{{- end -}}
{{- with $v.trustedProxies }}{{ $_ := set $config "trusted_proxies" . }}{{ end -}}
{{- $state := dict "fetch_log_max_rows" $v.state.fetchLogMaxRows "fetch_log_max_age_days" $v.state.fetchLogMaxAgeDays -}}
{{- if include "fleetllm.sqlite" . -}}
{{- $_ := set $state "url" "sqlite:////var/lib/fleetllm/control-plane.sqlite3" -}}
{{- else -}}
{{- $_ := set $state "url" $v.state.postgresql.url -}}
{{- with (get $names "pg-password") }}{{ $_ := set $state "password" . }}{{ end -}}
{{- end -}}
{{- $_ := set $config "state" $state -}}
{{- range $lists := (include "fleetllm.tokenLists" . | fromJsonArray) -}}
{{- $tokens := list -}}
{{- range $i, $token := index $v (index $lists 0) -}}
{{- with (get $names (include "fleetllm.tokenFile" (list (index $lists 1) $i))) -}}
{{- $tokens = append $tokens (ternary (dict "name" $token.name "token" .) . (not (empty $token.name))) -}}
{{- end -}}
{{- end -}}
{{- with $tokens }}{{ $_ := set $config (index $lists 2) . }}{{ end -}}
{{- end -}}
{{- with (get $names "metrics-token") }}{{ $_ := set $config "metrics_token" . }}{{ end -}}
{{- if include "fleetllm.oidc" . -}}
{{- $o := $v.auth.oidc -}}
{{- $oidc := dict "issuer" $o.issuer "client_id" $o.clientId "redirect_base" (include "fleetllm.redirectBase" .) "roles" $o.roles -}}
{{- with (get $names "oidc-client-secret") }}{{ $_ := set $oidc "client_secret" . }}{{ end -}}
{{- with $o.scopes }}{{ $_ := set $oidc "scopes" . }}{{ end -}}
{{- with $o.groupsClaim }}{{ $_ := set $oidc "groups_claim" . }}{{ end -}}
{{- if $o.acceptBearerJwts }}{{ $_ := set $oidc "accept_bearer_jwts" true }}{{ end -}}
{{- if not (kindIs "invalid" $o.leewayS) }}{{ $_ := set $oidc "leeway_s" (int $o.leewayS) }}{{ end -}}
{{- if not (kindIs "invalid" $o.timeoutS) }}{{ $_ := set $oidc "timeout_s" $o.timeoutS }}{{ end -}}
{{- $_ := set $config "auth" (dict "oidc" $oidc) -}}
{{- end -}}
{{- if $v.litellm.url -}}
{{- $litellm := dict "url" $v.litellm.url -}}
{{- with (get $names "litellm-master-key") }}{{ $_ := set $litellm "master_key" . }}{{ end -}}
{{- $_ := set $config "litellm" $litellm -}}
{{- end -}}
{{- $providers := dict -}}
{{- with (get $names "vast-api-key") }}{{ $_ := set $providers "vast" (dict "api_key" .) }}{{ end -}}
{{- with (get $names "runpod-api-key") }}{{ $_ := set $providers "runpod" (dict "api_key" .) }}{{ end -}}
{{- if $v.providers.static }}{{ $_ := set $providers "static" dict }}{{ end -}}
{{- with $providers }}{{ $_ := set $config "providers" . }}{{ end -}}
{{- $reconcile := dict -}}
{{- if not $v.reconcile.enabled }}{{ $_ := set $reconcile "enabled" false }}{{ end -}}
{{- if $v.reconcile.dryRun }}{{ $_ := set $reconcile "dry_run" true }}{{ end -}}
{{- with $v.reconcile.pushgateway -}}
{{- if and .url $v.reconcile.enabled (eq $v.reconcile.mode "cronjob") (not (eq $v.state.backend "sqlite")) }}{{ $_ := set $reconcile "pushgateway" (dict "url" .url "instance" .instance "timeout_s" .timeoutS) }}{{ end -}}
{{- end -}}
{{- with $reconcile }}{{ $_ := set $config "reconcile" . }}{{ end -}}
{{- $config = mergeOverwrite $config (deepCopy $v.extraConfig) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Settings that cannot be read from one value alone: each failure names the values and what to do. */}}
{{- define "fleetllm.check" -}}
{{- if and (eq .Values.state.backend "postgresql") (regexMatch "^[a-z]+://[^/@]*:[^/@]*@" .Values.state.postgresql.url) -}}
{{- fail "state.postgresql.url has a password in it: take it out of the URL and give it by reference, state.postgresql.password: {secret: ..., key: ...}" -}}
{{- end -}}
{{- range $where, $url := dict "litellm.url" .Values.litellm.url "reconcile.pushgateway.url" .Values.reconcile.pushgateway.url -}}
{{- if regexMatch "^[a-z]+://[^/@]*@" $url -}}
{{- fail (printf "%s carries a credential (user info before @): write the URL without it (reconcile.pushgateway.url may instead be ${cred:NAME}, NAME an extraCredentials entry holding the whole URL)" $where) -}}
{{- end -}}
{{- end -}}
{{- $tokenNames := dict -}}
{{- range $lists := (include "fleetllm.tokenLists" . | fromJsonArray) -}}
{{- range $i, $token := index $.Values (index $lists 0) -}}
{{- if and $token.name $token.key -}}
{{- $at := printf "%s[%d].name" (index $lists 0) $i -}}
{{- if hasKey $tokenNames $token.name -}}
{{- fail (printf "%s and %s are both %q: give each token its own name, so the audit trail tells them apart" (get $tokenNames $token.name) $at $token.name) -}}
{{- end -}}
{{- $_ := set $tokenNames $token.name $at -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (include "fleetllm.oidc" .) (not (include "fleetllm.redirectBase" .)) -}}
{{- fail "auth.oidc.redirectBase is empty and ingress.enabled is false: set auth.oidc.redirectBase to the control plane's URL as browsers reach it (scheme://host[:port]), or enable the Ingress, whose host then gives https://<ingress.host>" -}}
{{- end -}}
{{- if include "fleetllm.sqlite" . -}}
{{- if ne (int .Values.controlPlane.replicas) 1 -}}
{{- fail (printf "state.backend sqlite keeps the state in one file for one process: controlPlane.replicas must be 1 (it is %v); use state.backend postgresql for several replicas" .Values.controlPlane.replicas) -}}
{{- end -}}
{{- if and .Values.reconcile.enabled (ne .Values.reconcile.mode "loop") -}}
{{- fail "state.backend sqlite: the reconciler must share the control plane's pod and volume, so set reconcile.mode loop (a CronJob's pod could not open the SQLite file), or reconcile.enabled false" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A projected volume of the credentials: (dict "root" $ "name" "credentials" "reconcile" bool). */}}
{{- define "fleetllm.credentialsVolume" -}}
{{- $bySecret := dict -}}
{{- range (include "fleetllm.credentials" .root | fromJsonArray) -}}
{{- if not (and $.reconcile .serveOnly) -}}
{{- $_ := set $bySecret .secret (append (get $bySecret .secret | default list) (dict "key" .key "path" .name)) -}}
{{- end -}}
{{- end -}}
- name: {{ .name }}
  projected:
    defaultMode: 0400
    sources:
    {{- range $secret, $items := $bySecret }}
      - secret:
          name: {{ $secret }}
          items:
          {{- range $items }}
            - {key: {{ .key | quote }}, path: {{ .path | quote }}}
          {{- end }}
    {{- end }}
{{- end -}}

{{/* The reconciler's container: (dict "root" $ "name" "reconcile" "args" list "credentials" "credentials" "work" "work" "tmp" "tmp" "metrics" bool). */}}
{{- define "fleetllm.reconcileContainer" -}}
{{- $v := .root.Values -}}
- name: {{ .name }}
  image: {{ include "fleetllm.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args: {{ toJson .args }}
  env:
    - {name: CREDENTIALS_DIRECTORY, value: {{ include "fleetllm.credentialsDir" .root }}}
  {{- if .metrics }}
  ports:
    - {name: metrics, containerPort: {{ $v.reconcile.metricsPort }}}
  startupProbe:  # it serves /metrics and /health/live once the first fetch of the fleet repository is in
    httpGet: {path: /health/live, port: metrics}
    periodSeconds: 5
    failureThreshold: 60
  livenessProbe:  # /health/live: public (the probe sends no metrics token)
    httpGet: {path: /health/live, port: metrics}
    periodSeconds: 10
    failureThreshold: 6
  {{- end }}
  resources: {{- toYaml $v.reconcile.resources | nindent 4 }}
  securityContext: {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - {name: config, mountPath: /etc/fleetllm, readOnly: true}
    - {name: {{ .credentials }}, mountPath: {{ include "fleetllm.credentialsDir" .root }}, readOnly: true}
    - {name: {{ .work }}, mountPath: /var/lib/fleetllm}
    - {name: {{ .tmp }}, mountPath: /tmp}
{{- end -}}

{{/* Pod-level settings shared by every pod: (dict "root" $ "values" .Values.controlPlane-or-reconcile). */}}
{{- define "fleetllm.podSpecCommon" -}}
{{- $v := .root.Values -}}
automountServiceAccountToken: false
{{- with $v.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext: {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The ServiceMonitor endpoint's bearer: the metrics token from its Secret key, if there is one. */}}
{{- define "fleetllm.metricsAuthorization" -}}
{{- range (include "fleetllm.credentials" . | fromJsonArray) -}}
{{- if eq .name "metrics-token" -}}
authorization:
  type: Bearer
  credentials: {name: {{ .secret }}, key: {{ .key | quote }}}
{{- end -}}
{{- end -}}
{{- end -}}
