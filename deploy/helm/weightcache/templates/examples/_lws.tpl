{{/*
One pod of the LeaderWorkerSet example: the preload sidecar and vLLM. LWS
sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX in every
container; node i serves data-parallel rank i.
*/}}
{{- define "weightcache.lwsPod" -}}
{{- $root := .root -}}
{{- $ex := .ex -}}
{{- with $root.Values.gpu.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
securityContext:
  runAsUser: {{ $root.Values.runAsUser }}
  runAsGroup: {{ $root.Values.runAsGroup }}
initContainers:
  - name: weightcache
    image: {{ include "weightcache.image" $root }}
    restartPolicy: Always
    args:
      - preload
      - --model={{ .m.model }}
      - --dtype={{ .m.dtype | default "auto" }}
      # One rank per GPU; with --nnodes, node n's GPU i is dp_rank n x {{ $ex.gpusPerNode }} + i.
      - --data-parallel-size={{ .dp }}
      - --nnodes={{ $ex.size }}
      {{- if .leader }}
      # The leader is node 0: it hosts the rendezvous the workers dial.
      - --node-rank=0
      {{- else }}
      - --node-rank=$(LWS_WORKER_INDEX)
      {{- end }}
      - --master-addr=$(LWS_LEADER_ADDRESS)
      - --weight-cache-master-port={{ $ex.weightCacheMasterPort }}
      - --master-port=29500
      - --socket-dir=/run/xdg/weightcache
      - --weight-cache-health-host=$(POD_IP)
      - --weight-cache-health-port=9400
    env:
      - name: POD_IP
        valueFrom:
          fieldRef:
            fieldPath: status.podIP
      # The engine container holds the node's GPUs through the device plugin;
      # the sidecar sees them through the NVIDIA runtime without a request.
      - name: NVIDIA_VISIBLE_DEVICES
        value: all
      - name: NVIDIA_DRIVER_CAPABILITIES
        value: compute,utility
    ports:
      - name: wc-rendezvous
        containerPort: {{ $ex.weightCacheMasterPort }}
      - name: wc-metrics
        containerPort: 9400
    readinessProbe:
      httpGet:
        path: /health
        port: wc-metrics
      periodSeconds: 5
    resources:
      requests:
        memory: {{ $root.Values.memoryOverheadMiB }}Mi
      limits:
        memory: {{ $root.Values.memoryOverheadMiB }}Mi
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
    volumeMounts:
      - name: xdg
        mountPath: /run/xdg
      - name: models
        mountPath: {{ $root.Values.modelVolume.mountPath }}
        readOnly: true
containers:
  - name: vllm
    image: {{ $ex.image }}
    {{- if not .leader }}
    # Worker n's first data-parallel rank is n x {{ $ex.gpusPerNode }}: computed by the shell,
    # since the worker index is known only in the pod.
    command:
      - sh
      - -c
      - exec vllm serve "$@" --headless --data-parallel-start-rank=$((LWS_WORKER_INDEX * {{ $ex.gpusPerNode }}))
      - vllm
    {{- end }}
    args:
      - {{ .m.model }}
      - --dtype={{ .m.dtype | default "auto" }}
      - --load-format=weightcache
      - '--model-loader-extra-config={"mode": "zero_copy", "fallback": true}'
      - --data-parallel-size={{ .dp }}
      - --data-parallel-size-local={{ $ex.gpusPerNode }}
      {{- if .leader }}
      - --data-parallel-start-rank=0
      {{- end }}
      - --data-parallel-address=$(LWS_LEADER_ADDRESS)
      - --data-parallel-rpc-port=13345
      - --master-port=29500
    env:
      - name: XDG_RUNTIME_DIR
        value: /run/xdg
      - name: PYTHONPATH
        value: /weightcache/opt/weightcache/python
    {{- if .leader }}
    ports:
      - name: http
        containerPort: 8000
    readinessProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: 5
    {{- end }}
    resources:
      limits:
        nvidia.com/gpu: {{ $ex.gpusPerNode }}
    volumeMounts:
      - name: xdg
        mountPath: /run/xdg
      - name: models
        mountPath: {{ $root.Values.modelVolume.mountPath }}
        readOnly: true
      - name: weightcache-python
        mountPath: /weightcache
        readOnly: true
      - name: dshm
        mountPath: /dev/shm
volumes:
  # The daemon makes its socket directory (0700) inside; an emptyDir itself is
  # world-writable and would be refused.
  - name: xdg
    emptyDir: {}
  - name: models
    hostPath:
      path: {{ $root.Values.modelVolume.hostPath }}
      type: Directory
  - name: weightcache-python
    image:
      reference: {{ include "weightcache.image" $root }}
      pullPolicy: {{ $root.Values.image.pullPolicy }}
  # vLLM's processes on one node share memory through /dev/shm.
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: 16Gi
{{- end -}}
