package commands

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  string // a part of the error; "" for none
	}{
		{"0", 0, ""},
		{"1073741824", 1 << 30, ""},
		{"512MiB", 512 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"1gib", 1 << 30, ""},
		{"2Gi", 2 << 30, ""},
		{"1TiB", 1 << 40, ""},
		{"4KiB", 4096, ""},
		{"1k", 1000, ""},
		{"1K", 1000, ""},
		{"1kB", 1000, ""},
		{"200M", 200e6, ""},
		{"1G", 1e9, ""},
		{"1GB", 1e9, ""},
		{"3T", 3e12, ""},
		{"1.5GiB", 3 << 29, ""},
		{"0.5k", 500, ""},
		{"100B", 100, ""},
		{" 8MiB ", 8 << 20, ""},
		{"1 GiB", 1 << 30, ""},
		{"8388607TiB", 8388607 << 40, ""},
		{"8388608TiB", 0, "more than"},
		{"9223372036854775808", 0, "want a byte count"},
		{"1.5B", 0, "whole number of bytes"},
		{"1.0000001KiB", 0, "whole number of bytes"},
		{"-1", 0, "negative"},
		{"-1GiB", 0, "want a byte count"},
		{"+1GiB", 0, "want a byte count"},
		{"1e9", 0, "want a byte count"},
		{"1e3k", 0, "want a byte count"},
		{"GiB", 0, "want a byte count"},
		{"1GX", 0, "want a byte count"},
		{"1PiB", 0, "want a byte count"},
		{"0x10", 0, "want a byte count"},
		{"", 0, "want a byte count"},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := parseBytes(c.in)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("parseBytes(%q): %v", c.in, err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("parseBytes(%q) = %d, %v; want an error with %q", c.in, got, err, c.err)
			case got != c.want:
				t.Fatalf("parseBytes(%q) = %d, want %d", c.in, got, c.want)
			}
		})
	}
}

// TestFormatBytes: a default prints in the unit it was meant in and parses
// back to itself.
func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1 << 30: "1GiB", 512 << 20: "512MiB", 32 << 20: "32MiB", 1536: "1536", 1000: "1000", 3 << 40: "3TiB"} {
		got := formatBytes(n)
		if got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
		if back, err := parseBytes(got); err != nil || back != n {
			t.Errorf("parseBytes(formatBytes(%d)) = %d, %v", n, back, err)
		}
	}
}

// TestByteFlags: every byte-valued flag of every command takes units, and a
// bad value is a usage error that names the flag.
func TestByteFlags(t *testing.T) {
	flags := map[string][]string{
		"preload":    {"staging-bytes", "reserve-bytes", "read-limit", "max-inflight-bytes", "max-publish-bytes"},
		"cuda-bench": {"pinned-chunk"},
	}
	for cmd, names := range flags {
		for _, name := range names {
			t.Run(cmd+"/"+name, func(t *testing.T) {
				fs := commandFlags(registry[cmd])
				f := fs.Lookup(name)
				if f == nil {
					t.Fatalf("%s has no --%s", cmd, name)
				}
				if err := fs.Set(name, "3MiB"); err != nil || f.Value.String() != "3MiB" {
					t.Fatalf("--%s 3MiB: %v, reads back %q", name, err, f.Value.String())
				}
				var stdout, stderr bytes.Buffer
				code := run(context.Background(), env{stdout: &stdout, stderr: &stderr}, []string{cmd, "--model", "m", "--" + name, "12QB"})
				if code != exitUsage || !strings.Contains(stderr.String(), `invalid value "12QB" for flag --`+name+":") {
					t.Errorf("exit %d (want %d): %s", code, exitUsage, stderr.String())
				}
			})
		}
	}
	// Every flag whose name says bytes is one of them: a new one cannot be
	// added as a plain integer unnoticed.
	for name, c := range registry {
		commandFlags(c).VisitAll(func(f *flag.Flag) {
			if strings.HasSuffix(f.Name, "-bytes") {
				if _, ok := f.Value.(byteFlag); !ok {
					t.Errorf("%s --%s is not a byte flag", name, f.Name)
				}
			}
		})
	}
}
