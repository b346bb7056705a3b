{{/*
One pod of the LeaderWorkerSet example: the preload sidecar and vLLM. LWS
sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX in every
container; node i serves data-parallel rank i.
*/}}
{{- define "weightcache.lwsPod" -}}
{{- $root := .root -}}
{{- $ex := .ex -}}
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
      - --devices={{ .devices }}
      - --tensor-parallel-size={{ $ex.tensorParallelSize }}
      - --data-parallel-size=$(LWS_GROUP_SIZE)
      - --data-parallel-size-local=1
      {{- if .leader }}
      # The leader is node 0: it hosts the rendezvous the workers dial.
      - --data-parallel-start-rank=0
      - --nnodes=$(LWS_GROUP_SIZE)
      - --node-rank=0
      {{- else }}
      - --data-parallel-start-rank=$(LWS_WORKER_INDEX)
      - --nnodes=$(LWS_GROUP_SIZE)
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
        memory: {{ add $ex.residentMiB $root.Values.memoryOverheadMiB }}Mi
      limits:
        memory: {{ add $ex.residentMiB $root.Values.memoryOverheadMiB }}Mi
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
    args:
      - {{ .m.model }}
      - --dtype={{ .m.dtype | default "auto" }}
      - --load-format=weightcache
      - '--model-loader-extra-config={"mode": "zero_copy", "fallback": true}'
      - --tensor-parallel-size={{ $ex.tensorParallelSize }}
      - --data-parallel-size=$(LWS_GROUP_SIZE)
      - --data-parallel-size-local=1
      - --data-parallel-start-rank=$(LWS_WORKER_INDEX)
      - --data-parallel-address=$(LWS_LEADER_ADDRESS)
      - --data-parallel-rpc-port=13345
      - --master-port=29500
      {{- if not .leader }}
      - --headless
      {{- end }}
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
        nvidia.com/gpu: {{ $ex.tensorParallelSize }}
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
  # NCCL between the tensor-parallel workers of one node.
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: 16Gi
{{- end -}}
