package checkpoint

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// Synth writes a deterministic Llama-shaped checkpoint into dir: shards
// model-0000i-of-0000N.safetensors with model.safetensors.index.json
// (one shard: model.safetensors and no index), and config.json. preset is
// tiny, small or medium; dtype is bf16 (also ""), f16 or f32, or any
// spelling NormalizeDType accepts.
//
// Two runs with the same arguments write identical bytes. Tensor values
// depend only on (preset, tensor name), so the same model in bf16, f16 and
// f32 holds the same numbers. Memory stays bounded: tensors are generated
// a chunk at a time while written.
//
// dir must not exist or be empty. Everything is written into a temporary
// sibling directory that is renamed to dir at the end, so a crash leaves
// no half checkpoint at dir. Files are not fsynced: a power loss can
// leave truncated shards, which the reader then refuses.
func Synth(dir, preset string, shards int, dtype string) error {
	return SynthContext(context.Background(), dir, preset, shards, dtype)
}

// SynthContext is Synth that stops, leaving nothing behind, when ctx is
// done.
func SynthContext(ctx context.Context, dir, preset string, shards int, dtype string) error {
	plan, err := planSynth(preset, shards, dtype)
	if err != nil {
		return err
	}
	return intoPlace(dir, func(tmp string) error { return plan.writeAll(ctx, tmp) })
}

// intoPlace has write fill a fresh directory beside dir, then renames it
// to dir, so that a failed or cancelled write leaves nothing behind.
func intoPlace(dir string, write func(tmp string) error) error {
	if err := checkEmptyDir(dir); err != nil {
		return err
	}
	parent, base := filepath.Dir(dir), filepath.Base(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".synth-")
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = os.RemoveAll(tmp) // best effort: the error that got us here matters more
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	// os.Remove deletes only an empty directory, so a dir filled
	// meanwhile is never clobbered; os.Rename refuses to replace one.
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("synth: replacing empty %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("synth: moving the checkpoint into place: %w", err)
	}
	renamed = true
	return nil
}

func checkEmptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("synth output %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("synth output %s exists and is not empty; refusing to overwrite it", dir)
	}
	return nil
}

// writeAll writes the shards, then the index, then config.json.
func (p *synthPlan) writeAll(ctx context.Context, dir string) error {
	weightMap := map[string]string{}
	for i, tensors := range p.shards {
		name := "model.safetensors"
		if len(p.shards) > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(p.shards))
		}
		if err := p.writeShard(ctx, filepath.Join(dir, name), tensors); err != nil {
			return err
		}
		for _, t := range tensors {
			weightMap[t.name] = name
		}
	}
	if len(p.shards) > 1 {
		idx := map[string]any{
			"metadata":   map[string]int64{"total_size": p.dataBytes()},
			"weight_map": weightMap,
		}
		if err := writeJSON(filepath.Join(dir, IndexName), idx); err != nil {
			return err
		}
	}
	return writeJSON(filepath.Join(dir, "config.json"), p.config())
}

func (p *synthPlan) writeShard(ctx context.Context, path string, tensors []synthTensor) error {
	data := make([]safetensors.TensorData, len(tensors))
	for i, t := range tensors {
		data[i] = safetensors.TensorData{
			Name:  t.name,
			DType: p.dtype,
			Shape: t.shape,
			Fill:  synthFill(ctx, p.preset, t, p.dtype),
		}
	}
	meta := map[string]string{"format": "pt", "weightcache_synth": p.preset}
	return writeFile(path, func(w io.Writer) error { return safetensors.Write(w, meta, data) })
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// llamaConfig is config.json for the synthetic model, in the field order
// transformers writes.
type llamaConfig struct {
	Architectures         []string `json:"architectures"`
	BOSTokenID            int      `json:"bos_token_id"`
	EOSTokenID            int      `json:"eos_token_id"`
	HeadDim               int      `json:"head_dim"`
	HiddenAct             string   `json:"hidden_act"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	ModelType             string   `json:"model_type"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	RopeTheta             float64  `json:"rope_theta"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	TorchDType            string   `json:"torch_dtype"`
	VocabSize             int      `json:"vocab_size"`
}

func (p *synthPlan) config() llamaConfig {
	c := p.cfg
	return llamaConfig{
		Architectures:         []string{"LlamaForCausalLM"},
		BOSTokenID:            1,
		EOSTokenID:            2,
		HeadDim:               c.hidden / c.heads,
		HiddenAct:             "silu",
		HiddenSize:            c.hidden,
		IntermediateSize:      c.intermediate,
		MaxPositionEmbeddings: c.maxPos,
		ModelType:             "llama",
		NumAttentionHeads:     c.heads,
		NumHiddenLayers:       c.layers,
		NumKeyValueHeads:      c.kvHeads,
		RMSNormEps:            1e-5,
		RopeTheta:             10000,
		TieWordEmbeddings:     false,
		TorchDType:            p.torch,
		VocabSize:             c.vocab,
	}
}
