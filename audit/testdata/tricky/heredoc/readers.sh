#!/bin/sh
python3 - <<EOF
import subprocess
subprocess.run(["vllm", "serve", "m", "--quantization", "fp8"])
EOF
kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
spec:
  containers:
    - image: vllm/vllm-openai
      args: [--tokenizer-mode, slow]
YAML
ssh node1 <<-EOF
	vllm serve m --enable-mamba-fine-grained-prefix-cache
	EOF
X=$(cat <<EOF
vllm serve m --quantization fp8
EOF
)
echo done
