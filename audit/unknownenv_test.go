package audit

import "testing"

func TestClosestEnv(t *testing.T) {
	for name, want := range map[string]string{
		"VLLM_LOGGING_LEVL":               "VLLM_LOGGING_LEVEL",
		"VLLM_PLE_CPU_OFFLOAD_V2":         "VLLM_PLE_CPU_OFFLOAD",
		"VLLM_ENABLE_SCALE_OUT_ENDPOINTS": "", // nothing near
		"VLLM_X":                          "",
	} {
		if got := closestEnv(name); got != want {
			t.Errorf("closestEnv(%s) = %q, want %q", name, got, want)
		}
	}
	if d := editDistance("kitten", "sitting", 10); d != 3 {
		t.Errorf("editDistance(kitten, sitting) = %d, want 3", d)
	}
	if d := editDistance("kitten", "sitting", 2); d != 2 {
		t.Errorf("editDistance with limit 2 = %d, want the limit", d)
	}
}
