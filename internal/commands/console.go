package commands

import (
	"bytes"
	"io"
	"os"
	"sync"
	"time"
)

// clearLine returns the cursor to the start of the line and erases it.
const clearLine = "\r\033[K"

// console shares a terminal between preload's progress bar (on stdout) and
// the log lines of the launcher and its ranks (on stderr): both reach the
// same screen, and a log line written while the bar is drawn would start
// at the bar's end. Each log line erases the bar first; the bar comes back
// at the next tick, so a log line that ends the load (a rank's "ready")
// never leaves a stale bar under it.
type console struct {
	mu      sync.Mutex
	out     io.Writer // the bar
	err     io.Writer // the log
	bar     string    // drawn on out now; "" when nothing is
	partial []byte    // a log line not yet ended
}

// newConsole returns a console when stdout is a terminal, else nil: piped
// output gets no bar, and the ranks keep writing to stderr directly.
func newConsole(stdout, stderr io.Writer) *console {
	f, ok := stdout.(*os.File)
	if !ok || !isTerminal(f) {
		return nil
	}
	return &console{out: stdout, err: stderr}
}

// Write takes log output and writes it out whole lines at a time, so
// that the bar is never drawn inside a line. Errors of the terminal are
// not the writer's to report: a log must not fail a load.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	i := bytes.LastIndexByte(c.partial, '\n')
	if i < 0 {
		return len(p), nil
	}
	c.writeLocked(c.partial[:i+1])
	c.partial = append(c.partial[:0], c.partial[i+1:]...)
	return len(p), nil
}

func (c *console) writeLocked(lines []byte) {
	if c.bar != "" {
		_, _ = io.WriteString(c.out, clearLine)
	}
	_, _ = c.err.Write(lines)
	c.bar = ""
}

// flush writes a last line that did not end, with its newline.
func (c *console) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.writeLocked(append(c.partial, '\n'))
		c.partial = c.partial[:0]
	}
}

func (c *console) draw(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.out, clearLine+s)
	c.bar = s
}

func (c *console) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bar != "" {
		_, _ = io.WriteString(c.out, clearLine)
	}
	c.bar = ""
}

// progress redraws the bar every 200 ms until the returned function is
// called, which erases it.
func (c *console) progress(progress func() (int64, int64)) func() {
	done, stopped := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				c.clear()
				return
			case <-tick.C:
				c.draw(progressLine(progress, time.Since(start)))
			}
		}
	}()
	return func() { close(done); <-stopped }
}
