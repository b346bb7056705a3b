#!/bin/bash
cat <<'NOTE'
Operators: don't pass --quantization fp8 any more, it redirects.
NOTE
bash <<EOF
vllm serve m --tokenizer-mode slow
EOF
cat > /etc/systemd/system/engine.service <<UNIT
[Service]
ExecStart=/usr/bin/vllm serve m --enable-mamba-fine-grained-prefix-cache
UNIT
