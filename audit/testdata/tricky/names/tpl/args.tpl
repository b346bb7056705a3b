{{- define "engine.pod" -}}
apiVersion: v1
kind: Pod
spec:
  containers:
    - image: {{ .Values.image }}
      args: [--tokenizer-mode, slow]
{{- end }}
