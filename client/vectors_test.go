package client

import (
	"encoding/json"
	"os"
	"testing"
)

// missVector is one case of testdata/miss_vectors.json, which the Python
// client passes too (python/tests/test_shared_vectors.py): a miss, and
// the fix, String and MissError text it must produce.
type missVector struct {
	Name             string      `json:"name"`
	Reason           Reason      `json:"reason"`
	Detail           string      `json:"detail,omitempty"`
	Fields           []FieldDiff `json:"fields,omitempty"`
	DaemonModel      string      `json:"daemon_model,omitempty"`
	Model            string      `json:"model"`
	SocketDir        string      `json:"socket_dir"`
	DefaultSocketDir string      `json:"default_socket_dir"`
	Fix              string      `json:"fix"`
	Message          string      `json:"message"`
	Error            string      `json:"error"`
}

// TestMissVectors: Go and Python say the same on a miss, and the fix
// names the daemon's model and the command to run.
func TestMissVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/miss_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Misses []missVector `json:"misses"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Misses) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range file.Misses {
		t.Run(v.Name, func(t *testing.T) {
			src := Source{Reason: v.Reason, Detail: v.Detail, Fields: v.Fields, DaemonModel: v.DaemonModel}
			src.Fix = fix(src, v.Model, v.SocketDir, v.DefaultSocketDir)
			got := missVector{Fix: src.Fix, Message: src.String(), Error: (&MissError{Source: src}).Error()}
			if got.Fix != v.Fix {
				t.Errorf("fix\n got %q\nwant %q", got.Fix, v.Fix)
			}
			if got.Message != v.Message {
				t.Errorf("message\n got %q\nwant %q", got.Message, v.Message)
			}
			if got.Error != v.Error {
				t.Errorf("error\n got %q\nwant %q", got.Error, v.Error)
			}
		})
	}
}
