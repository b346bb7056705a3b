{{/* Names and labels. */}}
{{- define "weightcache.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weightcache.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "weightcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weightcache.labels" -}}
{{ include "weightcache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "weightcache.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A model's /health and /metrics port: healthPort, else 9400 + index. */}}
{{- define "weightcache.healthPort" -}}
{{- if .model.healthPort -}}{{ .model.healthPort }}{{- else -}}{{ add 9400 .index }}{{- end -}}
{{- end -}}

{{/* Where a model's sockets are on the node: under serve, every model's. */}}
{{- define "weightcache.socketHostPath" -}}
{{ trimSuffix "/" .root.Values.socketDir.hostPath }}/{{ if .root.Values.serve.enabled }}serve{{ else }}{{ .model.name }}{{ end }}
{{- end -}}

{{/* The headless Service peers find each other through. */}}
{{- define "weightcache.peersService" -}}
{{ include "weightcache.fullname" . | trunc 57 | trimSuffix "-" }}-peers
{{- end -}}

{{/* A model's peer port: peers.port + index. */}}
{{- define "weightcache.peerPort" -}}
{{ add .root.Values.peers.port .index }}
{{- end -}}

{{/*
Refuses peer values that cannot work: peers must authenticate, every
model's memory limit must hold its checkpoint's files (a preload that serves
peers keeps a copy), and its pieces need a trusted root (a manifest digest,
the hub cache's blob names, or the authenticated peers themselves).
*/}}
{{- define "weightcache.peerChecks" -}}
{{- $p := .Values.peers -}}
{{- if not (or $p.tls.secretName $p.tokenSecret.name) -}}
{{- fail "peers.enabled: peers must authenticate: set peers.tls.secretName (mutual TLS: a Secret with tls.crt, tls.key and ca.crt), peers.tokenSecret.name (a shared token), or both" -}}
{{- end -}}
{{- if and $p.tokenSecret.name (not $p.tokenSecret.key) -}}
{{- fail (printf "peers.tokenSecret.key: name the key of Secret %s that holds the token" $p.tokenSecret.name) -}}
{{- end -}}
{{- if .Values.serve.enabled -}}
{{- if $p.manifestDigest -}}
{{- fail "peers.manifestDigest with serve.enabled: serve's models take no manifest digest; set peers.trustPeers: true, or peers.hubCache: true for hub ids" -}}
{{- end -}}
{{- range .Values.models -}}
{{- if .peerManifestDigest -}}
{{- fail (printf "models[%s].peerManifestDigest with serve.enabled: serve's models take no manifest digest; set peers.trustPeers: true, or peers.hubCache: true for hub ids" .name) -}}
{{- end -}}
{{- end -}}
{{- if not (or $p.trustPeers $p.hubCache) -}}
{{- fail "peers with serve.enabled: its models' pieces need a trusted root: peers.trustPeers: true, or peers.hubCache: true (hub ids)" -}}
{{- end -}}
{{- else -}}
{{- if and $p.manifestDigest (gt (len .Values.models) 1) -}}
{{- fail (printf "peers.manifestDigest is one checkpoint's manifest: with %d models give each its models[].peerManifestDigest" (len .Values.models)) -}}
{{- end -}}
{{- range .Values.models -}}
{{- if not .checkpointMiB -}}
{{- fail (printf "peers.enabled: model %s: set its checkpointMiB to the checkpoint's size in MiB (the ready line's \"file_bytes\"): a preload that serves peers holds a copy of the files in its own memory, which its memory limit must allow" .name) -}}
{{- end -}}
{{- $d := .peerManifestDigest | default $p.manifestDigest -}}
{{- if and $d (not (regexMatch "^sha256:[0-9a-f]{64}$" $d)) -}}
{{- fail (printf "peers: model %s: manifest digest %q: want sha256: and 64 lowercase hex digits, as the ready line's \"peer_manifest\" says it" .name $d) -}}
{{- end -}}
{{- if not (or $d $p.hubCache $p.trustPeers) -}}
{{- fail (printf "peers.enabled: model %s has no trusted root for its piece manifest: set peers.manifestDigest or models[].peerManifestDigest (sha256:HEX, a first node's ready line \"peer_manifest\"), peers.hubCache: true (a hub id in the hub cache: its blob names are the root), or peers.trustPeers: true (every authenticated peer is trusted)" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
