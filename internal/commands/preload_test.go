package commands

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	line := progressLine(func() (int64, int64) { return 1 << 30, 3 << 30 }, 2*time.Second)
	for _, want := range []string{"1.00 GiB / 3.00 GiB", "512.0 MiB/s", "ETA 4s"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
	if line := progressLine(func() (int64, int64) { return 0, 1 << 20 }, time.Second); !strings.Contains(line, "ETA ?") {
		t.Errorf("no progress yet should have an unknown ETA: %q", line)
	}
}

// Progress is for people: piped output stays quiet so that the ready line
// is the only thing a script reads, and the ranks keep stderr itself.
func TestProgressQuietWhenNotATerminal(t *testing.T) {
	var buf bytes.Buffer
	if c := newConsole(&buf, &buf); c != nil {
		t.Fatal("a console on a buffer")
	}
}

// TestConsoleLinesWhole: on a terminal every log line starts at the start
// of a line, never glued to the bar, and the bar is not drawn again under
// it (the next tick does, while loading goes on).
func TestConsoleLinesWhole(t *testing.T) {
	var screen bytes.Buffer // stdout and stderr on one terminal
	c := &console{out: &screen, err: &screen}
	c.draw("loading 1 / 2")
	for _, p := range []string{"time=1 msg=ready", " pid=7\n", "time=2 msg=a\ntime=3 msg=b\n", "time=4 unended"} {
		if n, err := c.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	c.clear()
	c.flush()
	want := clearLine + "loading 1 / 2" +
		clearLine + "time=1 msg=ready pid=7\n" +
		"time=2 msg=a\ntime=3 msg=b\n" +
		"time=4 unended\n"
	if got := screen.String(); got != want {
		t.Errorf("screen\n got %q\nwant %q", got, want)
	}
}

// On a terminal the ready line is summed up for people in one line with
// one time, and stdout still gets the JSON line unchanged.
func TestReadySummary(t *testing.T) {
	var screen, stdout bytes.Buffer
	tee := &readyTee{out: &stdout, con: &console{out: &screen, err: &screen}}
	line := `{"event":"ready","socket":"/run/wc/main-host_0.sock","model":"/models/m","tensors":219,"bytes":1404718080,` +
		`"load_seconds":1.109,"loader_seconds":1.02,"read_bytes":1404718080,"source":"checkpoint",` +
		`"ranks":[{"device":"host:0"},{"device":"host:1"}]}` + "\n"
	event := `{"event":"rank_restarted","pid":7}` + "\n"
	for _, p := range []string{line[:40], line[40:], event} {
		if n, err := tee.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if stdout.String() != line+event {
		t.Errorf("stdout %q, want the lines unchanged", stdout.String())
	}
	want := "ready: /models/m, 219 tensors, 1.31 GiB on host:0,host:1 (2 ranks) in 1.11 s, read 1.31 GiB of the checkpoint; engines attach at /run/wc/main-host_0.sock\n"
	if screen.String() != want {
		t.Errorf("summary\n got %q\nwant %q", screen.String(), want)
	}
}
