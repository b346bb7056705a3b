//go:build linux

package launcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/handover"
)

// testMemfd is a memfd holding b, then grown to size (sparse: no memory
// used), sealed like a stored segment when sealed.
func testMemfd(t *testing.T, b []byte, size int64, sealed bool) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "test")
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if size > int64(len(b)) {
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
	}
	if sealed {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestReadMeta(t *testing.T) {
	good, err := json.Marshal(fdMeta{Version: handover.Version, Binary: "weightcache test", Control: "/run/wc/main.ctl"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    func(t *testing.T) *os.File
		want string // in the error; "" for none
	}{
		{"whole", func(t *testing.T) *os.File { return testMemfd(t, good, 0, true) }, ""},
		// Sparse: a read of it all would ask the runtime for 1 TiB.
		{"1 TiB", func(t *testing.T) *os.File { return testMemfd(t, good, 1<<40, true) }, "wc-meta: 1099511627776 bytes, more than a description can be (16777216)"},
		{"one byte over the cap", func(t *testing.T) *os.File { return testMemfd(t, good, maxMetaSize+1, true) }, "more than a description can be"},
		{"truncated", func(t *testing.T) *os.File { return testMemfd(t, good[:len(good)/2], 0, true) }, "wc-meta: truncated: its"},
		{"empty", func(t *testing.T) *os.File { return testMemfd(t, nil, 0, true) }, "wc-meta: empty"},
		{"trailing bytes", func(t *testing.T) *os.File { return testMemfd(t, append(good, " {}"...), 0, true) }, "wc-meta: not a description"},
		{"not sealed", func(t *testing.T) *os.File { return testMemfd(t, good, 0, false) }, "wc-meta: segment test carries seals"},
		{"missing", func(t *testing.T) *os.File { return nil }, "no wc-meta among the stored descriptors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := readMeta(tt.f(t))
			if tt.want == "" {
				if err != nil || m.Version != handover.Version || m.Binary != "weightcache test" || m.Control != "/run/wc/main.ctl" {
					t.Fatalf("readMeta: %+v, %v", m, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("readMeta: %v; want an error with %q", err, tt.want)
			}
		})
	}
}

func TestCheckRole(t *testing.T) {
	memfd := testMemfd(t, []byte("x"), 0, true)
	regular, err := os.CreateTemp(t.TempDir(), "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	tests := []struct {
		fd   int
		name string
		want string // in the error; "" for none
	}{
		{int(sock.Fd()), "wc-0-listen", ""},
		{int(sock.Fd()), "wc-ctl-listen", ""},
		{int(regular.Fd()), "wc-0-lock", ""},
		{int(memfd.Fd()), "wc-meta", ""},
		{int(memfd.Fd()), "wc-2-index", ""},
		{int(memfd.Fd()), "wc-0-seg-0", ""},
		{int(null.Fd()), "wc-0-seg-1", ""}, // a character device, as a CUDA handle
		{int(regular.Fd()), "unknown", ""},
		{int(memfd.Fd()), "wc-0-listen", "should be a socket, but is /memfd:test"},
		{int(memfd.Fd()), "wc-0-lock", "should be a lock file, but is /memfd:test"},
		{int(regular.Fd()), "wc-meta", "should be a memfd, but is " + regular.Name()},
		{int(sock.Fd()), "wc-0-index", "should be a memfd, but is socket:["},
		{int(regular.Fd()), "wc-0-seg-0", "should be a memfd or a CUDA handle"},
		{epfd, "wc-0-seg-0", "but is anon_inode:[eventpoll]"},
		{epfd, "unknown", "should be a socket or a file, but is anon_inode:[eventpoll]"},
		{int(null.Fd()), "wc-meta", "should be a memfd, but is /dev/null"},
		{int(memfd.Fd()), "wc-meta\nFDSTORE=1", "not a name systemd gives"},
		{int(memfd.Fd()), strings.Repeat("a", 256), "not a name systemd gives"},
		{int(memfd.Fd()), "wc-méta", "not a name systemd gives"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%.20s/%d", tt.name, tt.fd), func(t *testing.T) {
			err := checkRole(tt.fd, tt.name)
			if tt.want == "" && err != nil {
				t.Fatalf("checkRole(%s): %v", tt.name, err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("checkRole(%s): %v; want an error with %q", tt.name, err, tt.want)
			}
		})
	}
}

// A listenFiles child is this test binary run again with descriptors from
// fd 3 on, as systemd starts a service with a store, so that what it does
// to the descriptors after them (its own) cannot cost the test its own.
const (
	childMode  = "WC_TEST_LISTENFILES_CHILD"
	childNames = "WC_TEST_LISTENFILES_NAMES"
	childOK    = "listenFiles child: ok"
)

// passToChild starts the child in mode with the descriptors of a rank's
// store entry, one of them not what its name says, and returns what the
// child wrote.
func passToChild(t *testing.T, mode string) string {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "main-host.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sock, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	lock, err := os.Create(filepath.Join(dir, "main-host.sock.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	notMemfd, err := os.Create(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer notMemfd.Close()
	files := []*os.File{sock, lock, testMemfd(t, []byte("index"), 0, true), testMemfd(t, []byte("segment"), 0, true), notMemfd}
	names := []string{"wc-0-listen", "wc-0-lock", "wc-0-index", "wc-0-seg-0", "wc-0-seg-1"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestListenFilesChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childMode+"="+mode, childNames+"="+strings.Join(names, ":"))
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), childOK) {
		t.Fatalf("child (%v):\n%s", err, out)
	}
	return string(out)
}

// LISTEN_FDS counting more descriptors than were passed, with a name for
// each that says exactly what the process's own descriptor at that place
// is (its poller, a socket, a file): none of its own is taken, closed or
// wrapped; those passed are taken, but for one that is not what its name
// says, left open and reported.
func TestListenFilesBeyondPassed(t *testing.T) {
	out := passToChild(t, "beyond")
	for _, want := range []string{"ignoring the descriptors beyond those passed", "passed=5", "wc-0-seg-1", "should be a memfd or a CUDA handle"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the child's log lacks %q:\n%s", want, out)
		}
	}
}

// LISTEN_FDNAMES naming fewer descriptors than LISTEN_FDS: nothing is
// taken, and what was passed is made close-on-exec.
func TestListenFilesNamesMiscounted(t *testing.T) {
	out := passToChild(t, "miscounted")
	if !strings.Contains(out, "but LISTEN_FDNAMES names 5 descriptors") {
		t.Fatalf("the child's log lacks the reason:\n%s", out)
	}
}

// ownFDs is every descriptor from fd and up that this process holds, by
// what /proc says it is.
func ownFDs(t *testing.T, from int) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < from {
			continue
		}
		if link, err := fdLink(fd); err == nil && !strings.HasPrefix(link, "/proc/") { // not ReadDir's own
			out[fd] = link
		}
	}
	return out
}

// roleName names fd as what it is, as a forged store would.
func roleName(place int, link string) string {
	switch {
	case strings.HasPrefix(link, "socket:"):
		return fmt.Sprintf("wc-%d-listen", place)
	case strings.HasPrefix(link, "/memfd:"):
		return fmt.Sprintf("wc-%d-index", place)
	case strings.HasPrefix(link, "/"):
		return fmt.Sprintf("wc-%d-lock", place)
	}
	return fmt.Sprintf("wc-%d-seg-0", place) // the poller, its eventfd, a pipe
}

func TestListenFilesChild(t *testing.T) {
	mode := os.Getenv(childMode)
	if mode == "" {
		t.Skip("run by TestListenFilesBeyondPassed and TestListenFilesNamesMiscounted")
	}
	passed := strings.Split(os.Getenv(childNames), ":")
	first := listenFDsStart + len(passed)
	// Descriptors of its own right after those passed, as a launcher has
	// by then: a socket (which starts the runtime's poller) and a file.
	own, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "own"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	file, err := os.CreateTemp(t.TempDir(), "own")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	before := ownFDs(t, first)
	var places []int
	for fd := range before {
		places = append(places, fd)
	}
	sort.Ints(places)
	if len(places) == 0 || !strings.Contains(fmt.Sprint(before), "anon_inode:[eventpoll]") {
		t.Fatalf("the child's own descriptors after fd %d do not include the poller: %v", first, before)
	}
	names := append([]string(nil), passed...)
	for fd := first; fd <= places[len(places)-1]; fd++ {
		names = append(names, roleName(fd, before[fd]))
	}
	t.Setenv("LISTEN_FDS", strconv.Itoa(len(names)))
	if mode == "miscounted" {
		names = passed
	}
	t.Setenv("LISTEN_FDNAMES", strings.Join(names, ":"))
	var log bytes.Buffer
	got := listenFiles(slog.New(slog.NewTextHandler(&log, nil)))
	fmt.Print(log.String())

	want := map[string]int{"wc-0-listen": 3, "wc-0-lock": 4, "wc-0-index": 5, "wc-0-seg-0": 6}
	if mode == "miscounted" {
		want = map[string]int{}
	}
	if len(got) != len(want) {
		t.Errorf("listenFiles took %d descriptors, want %d: %v", len(got), len(want), got)
	}
	for name, fd := range want {
		if f := got[name]; f == nil || int(f.Fd()) != fd {
			t.Errorf("%s: got %v, want fd %d", name, f, fd)
		}
	}
	// As adoptStore does with what it does not use.
	for _, f := range got {
		_ = f.Close()
	}
	for _, v := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		if _, set := os.LookupEnv(v); set {
			t.Errorf("%s still set: the ranks would inherit it", v)
		}
	}
	// What was passed and not taken is still open, and not inherited by
	// the ranks.
	for fd := listenFDsStart; fd < first; fd++ {
		if name := passed[fd-listenFDsStart]; got[name] != nil {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("passed fd %d (%s), not taken: flags %#x, %v; want open and close-on-exec", fd, passed[fd-listenFDsStart], flags, err)
		}
	}
	// A finalizer of a wrapped descriptor would close it now.
	runtime.GC()
	runtime.GC()
	if after := ownFDs(t, first); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the child's own descriptors changed:\nbefore %v\nafter  %v", before, after)
	}
	// The poller still works: a connection accepted under a deadline.
	go func() {
		if c, err := net.Dial("unix", own.Addr().String()); err == nil {
			defer c.Close()
			_, _ = c.Write([]byte("x"))
			time.Sleep(time.Second)
		}
	}()
	_ = own.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := own.Accept()
	if err != nil {
		t.Fatalf("accept on the child's own socket: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("read through the poller: %v", err)
	}
	if !t.Failed() {
		fmt.Println(childOK)
	}
}

// storeSocket is a NOTIFY_SOCKET that reads nothing until told to.
func storeSocket(t *testing.T) (*fdStore, *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fdStore{notify: path}, c
}

// queueLen is how many datagrams a unix socket queues unread.
func queueLen(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/unix/max_dgram_qlen")
	if err != nil {
		t.Skipf("max_dgram_qlen: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n > 4096 {
		t.Skipf("max_dgram_qlen %q: too long a queue to fill here", b)
	}
	return n
}

// readStore reads every datagram c receives into names, with the count of
// descriptors it brought, pausing after each.
func readStore(c *net.UnixConn, pause time.Duration, names chan<- string) {
	buf, oob := make([]byte, 4096), make([]byte, syscall.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			close(names)
			return
		}
		var fds []int
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if got, err := syscall.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
		names <- fmt.Sprintf("%s (%d descriptors)", buf[:n], len(fds))
		time.Sleep(pause)
	}
}

// fillQueue sends datagrams to path until its queue is full, and returns
// how many it took.
func fillQueue(t *testing.T, path string) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	for n := 0; n < 1<<16; n++ {
		err := syscall.Sendmsg(fd, []byte("FDSTORE=1\nFDNAME=filler"), nil, &syscall.SockaddrUnix{Name: path}, syscall.MSG_DONTWAIT)
		if err == syscall.EAGAIN {
			return n
		}
		if err != nil {
			t.Fatalf("fill the queue of %s: %v", path, err)
		}
	}
	t.Skipf("the queue of %s takes more than %d datagrams", path, 1<<16)
	return 0
}

// A burst far longer than the store's queue, to a store that reads
// slowly: every datagram is stored, in order.
func TestSendWaitsForASlowStore(t *testing.T) {
	s, c := storeSocket(t)
	n := queueLen(t) + 30
	f := testMemfd(t, []byte("x"), 0, true)
	names := make(chan string, n)
	go func() {
		time.Sleep(200 * time.Millisecond) // the queue fills meanwhile
		readStore(c, 3*time.Millisecond, names)
	}()
	for i := 0; i < n; i++ {
		if err := s.send(fmt.Sprintf("FDSTORE=1\nFDNAME=wc-0-seg-%d", i), f); err != nil {
			t.Fatalf("datagram %d of %d: %v", i, n, err)
		}
	}
	for i := 0; i < n; i++ {
		select {
		case got := <-names:
			if want := fmt.Sprintf("FDSTORE=1\nFDNAME=wc-0-seg-%d (1 descriptors)", i); got != want {
				t.Fatalf("datagram %d: %q, want %q", i, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d datagrams stored", i, n)
		}
	}
}

// A store that does not read: a datagram waits for it at most
// storeSendTimeout, and fails naming the descriptor; later ones fail at
// once until the store reads again, then go through.
func TestSendGivesUpOnAStoreThatDoesNotRead(t *testing.T) {
	s, c := storeSocket(t)
	qlen := fillQueue(t, s.notify)
	f := testMemfd(t, []byte("x"), 0, true)
	timed := func(name string, limit time.Duration) (time.Duration, error) {
		t.Helper()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- s.send("FDSTORE=1\nFDNAME="+name, f) }()
		select {
		case err := <-done:
			return time.Since(start), err
		case <-time.After(limit):
			t.Fatalf("send of %s to a store that does not read still waiting after %v", name, limit)
		}
		return 0, nil
	}
	took, err := timed("wc-meta", storeSendTimeout+3*time.Second)
	if err == nil || !strings.Contains(err.Error(), "FDNAME=wc-meta") || !strings.Contains(err.Error(), fmt.Sprintf("stayed full for %v", storeSendTimeout)) {
		t.Fatalf("send to a full queue: %v", err)
	}
	if took < storeSendTimeout {
		t.Fatalf("gave up after %v, before the %v a busy store is given", took, storeSendTimeout)
	}
	took, err = timed("wc-0-listen", storeSendTimeout+3*time.Second)
	if err == nil || !strings.Contains(err.Error(), "FDNAME=wc-0-listen") || took > storeSendTimeout/2 {
		t.Fatalf("second send to a store known not to read: %v after %v; want a failure at once", err, took)
	}
	names := make(chan string, qlen+1)
	go readStore(c, 0, names)
	for i := 0; i < qlen; i++ {
		<-names
	}
	if _, err := timed("wc-0-lock", storeSendTimeout+3*time.Second); err != nil {
		t.Fatalf("send once the store reads again: %v", err)
	}
	if s.stalled.Load() {
		t.Fatal("still taken for a store that does not read")
	}
}
