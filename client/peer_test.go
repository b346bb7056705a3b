package client

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/weightcache/weightcache/internal/sockets"
)

// A socket that another uid listens on, moved into this user's own 0700
// socket directory (which passes the directory check), is refused by its
// peer's uid before the hello: the foreign listener reads nothing, and
// the engine's miss names the socket and both uids.
func TestForeignDaemonRefusedBeforeHello(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a listener as another uid")
	}
	py := "/usr/bin/python3" // a per-user one is not executable by the foreign uid
	if _, err := os.Stat(py); err != nil {
		t.Skip("needs /usr/bin/python3 for the foreign listener")
	}
	const nobody = 65534
	foreign, err := os.MkdirTemp("", "wcforeign")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(foreign) })
	if err := os.Chmod(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(foreign, "d")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	// It prints how many bytes each connection sent before it closed.
	script := `import socket,sys
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); print("listening", flush=True)
while True:
    c,_=s.accept(); print(len(c.recv(65536)), flush=True); c.close()`
	cmd := exec.Command(py, "-c", script, filepath.Join(theirs, "s.sock"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "listening" {
		t.Fatalf("foreign listener: %q, %v", lines.Text(), lines.Err())
	}
	dir := socketDir(t)
	sock, err := sockets.Path(dir, "main", "host")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(theirs, "s.sock"), sock); err != nil {
		t.Fatal(err)
	}
	w, err := Attach(context.Background(), synth(t), WithSocketDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	src := w.Source
	for _, want := range []string{sock, "served by uid 65534", "this process's uid 0"} {
		if src.Hit || src.Reason != ReasonProtocolError || !strings.Contains(src.Detail, want) {
			t.Fatalf("engine beside a foreign socket: %s, want a protocol_error miss saying %q", src, want)
		}
	}
	// A strict engine gets the miss as an error of its reason.
	_, err = Attach(context.Background(), synth(t), WithSocketDir(dir), WithFallback(false))
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "served by uid 65534") {
		t.Fatalf("strict engine: %v, want ErrProtocol naming the foreign uid", err)
	}
	for _, engine := range []string{"lenient", "strict"} {
		if !lines.Scan() || lines.Text() != "0" {
			t.Fatalf("the foreign listener read %q bytes of the %s engine, want 0: a hello went out (%v)", lines.Text(), engine, lines.Err())
		}
	}
}
