package cuda

import (
	"errors"
	"runtime"
	"sync"
	"syscall"
	"testing"
)

// dlerror's text is per OS thread, so dlopen and dlerror must run on one:
// a goroutine moved between them reported "load libcuda.so.1: " and no
// reason. The fake dlopen yields as often as the real one may be preempted
// and says whether it was moved.
func TestDlopenStaysOnItsThread(t *testing.T) {
	defer func(f func(string, int) (uintptr, error)) { dlopen = f }(dlopen)
	dlopen = func(string, int) (uintptr, error) {
		tid := syscall.Gettid()
		for range 2000 {
			runtime.Gosched()
			if syscall.Gettid() != tid {
				return 0, errors.New("moved to another thread: dlerror would read its text")
			}
		}
		return 0, errors.New("no such file")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	for range 5 {
		if _, err := dlopenLocked("libcuda.so.1"); err.Error() != "no such file" {
			t.Fatal(err)
		}
	}
}
