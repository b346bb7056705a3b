package models

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/launcher"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/sockets"
	"github.com/weightcache/weightcache/internal/status"
)

// Config describes one serve.
type Config struct {
	SocketDir string
	Budget    int64  // bytes on each device; 0: none
	Devices   string // the devices a load names none: as preload's --devices
	// Resolve turns a --devices value into device keys (GPU-<uuid>,
	// host, host:N), what the budget counts by; nil splits at commas.
	Resolve func(devices string) ([]string, error)
	// HostTier moves a model evicted from GPUs to host devices where the
	// budget there has room, instead of dropping it.
	HostTier bool
	TPSize   int
	// Exe is the weightcache binary each model's preload runs.
	Exe string
	// PreloadArgs go to every preload after the model's own flags.
	PreloadArgs []string
	// StopTimeout bounds a preload's exit after SIGTERM (its drain
	// timeout and a margin), after which it is killed.
	StopTimeout time.Duration
	// Peers, when set, are every node's serve (hosts, this one's
	// included, as a headless Service resolves), each serving peers on
	// PeerPort: a model's preload seeds from them, and serves them
	// through this node's serve, which relays to it (Relay).
	Peers    []string
	PeerPort int
	// PeerSent counts the bytes relayed to peers, for /metrics.
	PeerSent func() int64
	// PeerArgs go to every preload that trades with peers (its
	// authentication and trust flags).
	PeerArgs []string
	Stderr   io.Writer
	Logger   *slog.Logger
}

// Spec names a model to load or drop.
type Spec struct {
	Model    string `json:"model"`
	Revision string `json:"revision,omitempty"`
	DType    string `json:"dtype,omitempty"` // as preload's --dtype; "" is auto
	// Devices are where it is served, as preload's --devices; "" is
	// serve's. Resident, the device keys.
	Devices string `json:"devices,omitempty"`
	// TPSize is its tensor-parallel size, one rank per device; 0 is
	// serve's.
	TPSize int `json:"tensor_parallel_size,omitempty"`
	// PublishOnly stages an empty model that an engine, or a trainer,
	// publishes a layout into (preload --publish-only): a version that
	// exists nowhere else, so it is never evicted, only dropped. Engine and
	// EngineVersion name that layout: engines attach it by them.
	PublishOnly   bool   `json:"publish_only,omitempty"`
	Engine        string `json:"engine,omitempty"`
	EngineVersion string `json:"engine_version,omitempty"`
}

// Status is a resident model as List reports it.
type Status struct {
	Spec
	Key        string `json:"key"`
	Checkpoint string `json:"checkpoint"`
	SocketDir  string `json:"socket_dir"`
	// Bytes is what it holds on each device: its largest rank's. Need is
	// what the load reckoned it would, before it read anything (for a
	// staged model, what its checkpoint holds); the budget counts the
	// larger.
	Bytes   int64 `json:"bytes"`
	Need    int64 `json:"need"`
	Tensors int   `json:"tensors"`
	// PeerBytes and StorageBytes are where its load got its bytes.
	PeerBytes    int64     `json:"peer_bytes,omitempty"`
	StorageBytes int64     `json:"storage_bytes,omitempty"`
	Source       string    `json:"source,omitempty"`
	Leases       int       `json:"leases"`
	LastUsed     time.Time `json:"last_used"`
	LoadedAt     time.Time `json:"loaded_at"`
	LoadSeconds  float64   `json:"load_seconds"`
	PID          int       `json:"pid"`
	// DropWhenUnused: it is dropped once its last lease ends (drop
	// --when-unused), unless a load keeps it first.
	DropWhenUnused bool   `json:"drop_when_unused,omitempty"`
	State          string `json:"state"` // ready; or a rank's state when one is not
	Error          string `json:"error,omitempty"`
}

// Loaded is the reply to a load.
type Loaded struct {
	Status
	Already bool     `json:"already,omitempty"` // it was resident: nothing was read
	Evicted []string `json:"evicted,omitempty"`
	// Moved are the evicted models loaded on host devices instead
	// (HostTier).
	Moved []string `json:"moved,omitempty"`
}

// Manager runs the preloads of a managed socket directory.
type Manager struct {
	cfg Config
	// decide makes one load or drop at a time: a budget decision holds
	// until its preload is ready or gone.
	decide sync.Mutex
	mu     sync.Mutex
	models map[string]*entry // by key
	// relays are the Unix sockets the preloads serve peers on, by
	// checkpoint hash, from their start: a node still loading a model
	// serves the pieces it has.
	relays map[string]string
	loads  int64
	evicts int64
}

type entry struct {
	Status
	hash string // the checkpoint's (peer.Server's key)
	// unused: drop it once its last lease ends (guarded by mu).
	unused bool
	cmd    *exec.Cmd
	exited chan struct{} // closed when the preload has exited and been reaped
}

// New prepares the managed directory: the socket directory itself, and
// its models directory, emptied of what a serve before this one left. The
// caller holds the directory's control socket (Listen) already, so that
// no live serve's models are in it.
func New(cfg Config) (*Manager, error) {
	if err := sockets.EnsureDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	md := sockets.ModelsDir(cfg.SocketDir)
	if err := os.RemoveAll(md); err != nil {
		return nil, fmt.Errorf("models directory %s: %w", md, err)
	}
	if err := os.Mkdir(md, 0o700); err != nil {
		return nil, fmt.Errorf("models directory %s: %w", md, err)
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	return &Manager{cfg: cfg, models: map[string]*entry{}, relays: map[string]string{}}, nil
}

// Load makes spec resident: at once if it is, else by a preload of its
// own, after evicting what the budget needs.
func (m *Manager) Load(ctx context.Context, spec Spec) (*Loaded, error) {
	spec.DType = cmp.Or(spec.DType, "auto")
	switch {
	case spec.PublishOnly && spec.Engine == "":
		return nil, fmt.Errorf("stage %s: a staged model needs the engine (and version) that will publish it", spec.Model)
	case !spec.PublishOnly && spec.Engine != "":
		return nil, fmt.Errorf("load %s: --engine names a published layout: stage it with --publish-only", spec.Model)
	}
	ckpt, err := checkpoint.Resolve(spec.Model, spec.Revision)
	if err != nil {
		return nil, err
	}
	served, err := ckpt.ServedDType(spec.DType)
	if err != nil {
		return nil, fmt.Errorf("--dtype %q for %s: %w", spec.DType, spec.Model, err)
	}
	serves := max(m.cfg.TPSize, 1)
	switch spec.TPSize = cmp.Or(spec.TPSize, serves); {
	case spec.TPSize < 1:
		return nil, fmt.Errorf("load %s: --tensor-parallel-size must be at least 1, got %d", spec.Model, spec.TPSize)
	case spec.TPSize != serves && spec.Devices == "":
		// serve's devices are as many as its own size.
		return nil, fmt.Errorf("load %s: --tensor-parallel-size %d is not serve's (%d): name its %d devices with --devices", spec.Model, spec.TPSize, serves, spec.TPSize)
	}
	need, err := perDevice(ckpt, served, spec.TPSize)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", spec.Model, err)
	}
	asked := cmp.Or(spec.Devices, m.cfg.Devices)
	devices, err := m.resolve(asked)
	if err != nil {
		return nil, fmt.Errorf("load %s: --devices %q: %w", spec.Model, asked, err)
	}
	spec.Devices = strings.Join(devices, ",")
	key := sockets.ModelKey(ckpt.Dir, spec.Engine, spec.EngineVersion)
	m.decide.Lock()
	defer m.decide.Unlock()
	if e := m.get(key); e != nil {
		if e.DType != spec.DType {
			return nil, fmt.Errorf("model %s is resident with --dtype %q: drop it before loading it with %q", spec.Model, e.DType, spec.DType)
		}
		if e.Devices != spec.Devices {
			return nil, fmt.Errorf("model %s is resident on %s: drop it before loading it on %s", spec.Model, e.Devices, spec.Devices)
		}
		if e.TPSize != spec.TPSize {
			return nil, fmt.Errorf("model %s is resident at tensor-parallel size %d: drop it before loading it at %d", spec.Model, e.TPSize, spec.TPSize)
		}
		m.mu.Lock()
		e.unused = false // asked for again: kept
		m.mu.Unlock()
		cur := m.describe(ctx, e)
		return &Loaded{Status: cur, Already: true}, nil
	}
	victims, err := Evict(m.cfg.Budget, m.residents(ctx), need, devices)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", spec.Model, err)
	}
	out := &Loaded{}
	for _, v := range victims {
		e := m.get(v.Key)
		if e == nil {
			continue
		}
		m.cfg.Logger.Info("evicting the least recently used model without a lease", "model", v.Name, "bytes", v.Bytes, "last_used", v.LastUsed, "for", spec.Model)
		if err := m.stop(e); err != nil {
			return nil, fmt.Errorf("load %s: evicting %s: %w", spec.Model, v.Name, err)
		}
		m.mu.Lock()
		m.evicts++
		m.mu.Unlock()
		out.Evicted = append(out.Evicted, v.Name)
		if m.cfg.HostTier && slices.ContainsFunc(v.Devices, cuda.IsDevice) && !e.PublishOnly {
			if err := m.toHost(ctx, e); err != nil {
				m.cfg.Logger.Info("an evicted model stays off the host tier", "model", v.Name, "why", err)
			} else {
				out.Moved = append(out.Moved, v.Name)
			}
		}
	}
	e, err := m.start(ctx, spec, ckpt.Dir, ckpt.Hash(), key, need)
	if err != nil {
		return nil, err
	}
	out.Status = m.describe(ctx, e)
	return out, nil
}

// residents describes every resident model for Evict.
func (m *Manager) residents(ctx context.Context) []Resident {
	all := m.List(ctx)
	rs := make([]Resident, len(all))
	for i, mo := range all {
		rs[i] = Resident{Key: mo.Key, Name: mo.name(), Devices: strings.Split(mo.Devices, ","), Bytes: max(mo.Bytes, mo.Need),
			Leases: mo.Leases, LastUsed: mo.LastUsed}
		switch {
		case mo.PublishOnly:
			rs[i].Kept = "published, in no file: drop it"
		case mo.State == "unreachable":
			rs[i].Kept = "unreachable, its leases unknown"
		}
	}
	return rs
}

// toHost loads e's model, just evicted from its GPUs, on host devices, as
// many as its ranks, when the budget there has room without evicting
// anything: engines that load through the host tier (the vLLM loader's
// tier 1) still find it.
func (m *Manager) toHost(ctx context.Context, e *entry) error {
	devices := launcher.DefaultDevices(e.TPSize)
	victims, err := Evict(m.cfg.Budget, m.residents(ctx), e.Need, strings.Split(devices, ","))
	switch {
	case err != nil:
		return err
	case len(victims) > 0:
		return fmt.Errorf("the host tier has no room without evicting %s", victims[0].Name)
	}
	spec := e.Spec
	spec.Devices = devices
	_, err = m.start(ctx, spec, e.Checkpoint, e.hash, e.Key, e.Need)
	return err
}

func (m *Manager) resolve(devices string) ([]string, error) {
	if m.cfg.Resolve != nil {
		return m.cfg.Resolve(devices)
	}
	return strings.Split(devices, ","), nil
}

// perDevice is what the model holds on the device of its largest rank,
// each tensor at its 256-byte-aligned size as the segments place it.
func perDevice(c *checkpoint.Checkpoint, served string, tp int) (int64, error) {
	ts, err := c.ServedTensors(served)
	if err != nil {
		return 0, err
	}
	var p *plan.Plan
	var pm plan.Model
	if tp > 1 {
		if p, err = plan.ForArchitecture(c.Architecture); err != nil {
			return 0, err
		}
		if pm, err = plan.ReadModel(c.Dir); err != nil {
			return 0, err
		}
	}
	var most int64
	for rank := range tp {
		var n int64
		for _, t := range ts {
			b := t.NBytes
			if p != nil {
				sl, err := p.SliceFor(t.Tensor.Name, t.Tensor.Shape, pm, tp, rank)
				if err != nil {
					return 0, err
				}
				if !sl.Whole() && t.Tensor.Shape[sl.Dim] > 0 {
					b = b / t.Tensor.Shape[sl.Dim] * sl.Len
				}
			}
			n += (b + 255) &^ 255
		}
		most = max(most, n)
	}
	return most, nil
}

func (m *Manager) get(key string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.models[key]
}

// name is the model as the operator named it, with its revision, and the
// engine and version of a staged layout.
func (s *Status) name() string {
	n := s.Model
	if s.Revision != "" {
		n += "@" + s.Revision
	}
	if s.Engine != "" {
		n += " (" + s.Engine + " " + s.EngineVersion + ")"
	}
	return n
}

// start runs the model's preload in its own socket directory and waits for
// its ready line.
func (m *Manager) start(ctx context.Context, spec Spec, ckptDir, hash, key string, need int64) (*entry, error) {
	dir := filepath.Join(sockets.ModelsDir(m.cfg.SocketDir), key)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("socket directory of %s: %w", spec.Model, err)
	}
	args := []string{"preload", "--model", spec.Model, "--socket-dir", dir, "--dtype", spec.DType,
		"--tensor-parallel-size", strconv.Itoa(spec.TPSize)}
	if spec.Revision != "" {
		args = append(args, "--revision", spec.Revision)
	}
	if spec.PublishOnly {
		args = append(args, "--publish-only")
	}
	if spec.Devices != "" {
		args = append(args, "--devices", spec.Devices)
	}
	relay := ""
	if len(m.cfg.Peers) > 0 && !spec.PublishOnly {
		var peers []string
		port := strconv.Itoa(m.cfg.PeerPort)
		for _, h := range m.cfg.Peers {
			peers = append(peers, net.JoinHostPort(h, port))
		}
		// Not *.sock: that is a daemon's, which status and clients ask.
		relay = filepath.Join(dir, "peers.relay")
		args = append(args, "--peers", strings.Join(peers, ","), "--peer-listen", ":"+port, "--peer-relay", relay)
		args = append(args, m.cfg.PeerArgs...)
	}
	args = append(args, m.cfg.PreloadArgs...)
	cmd := exec.Command(m.cfg.Exe, args...)
	cmd.SysProcAttr = childAttr()
	var tail tailBuffer
	cmd.Stderr = io.MultiWriter(m.cfg.Stderr, &tail)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the preload of %s: %w", spec.Model, err)
	}
	e := &entry{cmd: cmd, exited: make(chan struct{}), hash: hash}
	e.Spec, e.Key, e.Checkpoint, e.SocketDir, e.PID, e.Need = spec, key, ckptDir, dir, cmd.Process.Pid, need
	if relay != "" {
		m.mu.Lock()
		m.relays[hash] = relay
		m.mu.Unlock()
	}
	readyCh := make(chan launcher.ReadyLine, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		ready := false
		for sc.Scan() {
			var rl launcher.ReadyLine
			if !ready && json.Unmarshal(sc.Bytes(), &rl) == nil && rl.Event == "ready" {
				ready = true
				readyCh <- rl
				continue
			}
			m.cfg.Logger.Info("preload", "model", spec.Model, "line", sc.Text())
		}
		err := cmd.Wait()
		m.mu.Lock()
		if m.models[key] == e {
			delete(m.models, key)
			m.cfg.Logger.Warn("a model's preload exited; the model is no longer resident", "model", spec.Model, "err", err)
		}
		if relay != "" && m.relays[hash] == relay {
			delete(m.relays, hash)
		}
		m.mu.Unlock()
		close(e.exited)
	}()
	select {
	case rl := <-readyCh:
		e.LoadedAt, e.LoadSeconds, e.Tensors, e.Source = time.Now(), time.Since(began).Seconds(), rl.Tensors, rl.Source
		if rl.PeerBytes != nil && rl.StorageBytes != nil {
			e.PeerBytes, e.StorageBytes = *rl.PeerBytes, *rl.StorageBytes
		}
	case <-e.exited:
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("the preload of %s exited before it served (%s): %s", spec.Model, cmd.ProcessState, tail.String())
	case <-ctx.Done():
		m.kill(e)
		return nil, fmt.Errorf("load %s: %w", spec.Model, ctx.Err())
	}
	m.mu.Lock()
	m.models[key] = e
	m.loads++
	m.mu.Unlock()
	return e, nil
}

// Relay is the Unix socket of the preload that serves peers the
// checkpoint with this hash, or "": serve's peer.Server.Route.
func (m *Manager) Relay(hash string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.relays[hash]
}

// Drop stops the model's preload. A model with leases is kept unless
// force: then its engines get the preload's drain timeout.
func (m *Manager) Drop(ctx context.Context, spec Spec, force, whenUnused bool) (*Status, error) {
	ckpt, err := checkpoint.ResolveLazily(spec.Model, spec.Revision)
	if err != nil {
		return nil, err
	}
	m.decide.Lock()
	defer m.decide.Unlock()
	e := m.get(sockets.ModelKey(ckpt.Dir, spec.Engine, spec.EngineVersion))
	if e == nil {
		return nil, fmt.Errorf("model %s is not resident in %s", spec.Model, m.cfg.SocketDir)
	}
	cur := m.describe(ctx, e)
	if cur.Leases > 0 && !force {
		if whenUnused {
			m.mu.Lock()
			e.unused = true
			m.mu.Unlock()
			cur.DropWhenUnused = true
			return &cur, nil
		}
		return nil, fmt.Errorf("model %s has %d leases: engines map its memory; stop them first, or drop with --force to give them the drain timeout", spec.Model, cur.Leases)
	}
	if err := m.stop(e); err != nil {
		return nil, err
	}
	return &cur, nil
}

// ReapEvery is how often the models to drop once unused are looked at.
const ReapEvery = 500 * time.Millisecond

// reap drops each model marked DropWhenUnused once it has no lease, until
// ctx ends.
func (m *Manager) reap(ctx context.Context) {
	t := time.NewTicker(ReapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		var marked []*entry
		for _, e := range m.models {
			if e.unused {
				marked = append(marked, e)
			}
		}
		m.mu.Unlock()
		for _, e := range marked {
			m.reapOne(ctx, e)
		}
	}
}

func (m *Manager) reapOne(ctx context.Context, e *entry) {
	m.decide.Lock()
	defer m.decide.Unlock()
	m.mu.Lock()
	still := m.models[e.Key] == e && e.unused
	m.mu.Unlock()
	if !still {
		return
	}
	if cur := m.describe(ctx, e); cur.Leases > 0 || cur.State == "unreachable" {
		return
	}
	if err := m.stop(e); err != nil {
		m.cfg.Logger.Warn("a model asked to be dropped once unused could not be", "model", e.name(), "err", err)
		return
	}
	m.cfg.Logger.Info("dropped a model once its last lease ended, as asked", "model", e.name())
}

// stop ends a preload: SIGTERM, then SIGKILL after the stop timeout. Its
// socket directory goes with it.
func (m *Manager) stop(e *entry) error {
	m.mu.Lock()
	delete(m.models, e.Key)
	m.mu.Unlock()
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(m.cfg.StopTimeout):
		m.kill(e)
	}
	if err := os.RemoveAll(e.SocketDir); err != nil {
		return fmt.Errorf("remove %s: %w", e.SocketDir, err)
	}
	return nil
}

func (m *Manager) kill(e *entry) {
	_ = e.cmd.Process.Kill()
	<-e.exited
	_ = os.RemoveAll(e.SocketDir)
}

// Shutdown stops every preload, all at once.
func (m *Manager) Shutdown() {
	m.decide.Lock()
	defer m.decide.Unlock()
	m.mu.Lock()
	es := make([]*entry, 0, len(m.models))
	for _, e := range m.models {
		es = append(es, e)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Go(func() { _ = m.stop(e) })
	}
	wg.Wait()
}

// List describes every resident model, oldest load first, from its ranks'
// own stats.
func (m *Manager) List(ctx context.Context) []Status {
	m.mu.Lock()
	es := make([]*entry, 0, len(m.models))
	for _, e := range m.models {
		es = append(es, e)
	}
	m.mu.Unlock()
	out := make([]Status, len(es))
	var wg sync.WaitGroup
	for i, e := range es {
		wg.Go(func() { out[i] = m.describe(ctx, e) })
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Status) int { return a.LoadedAt.Compare(b.LoadedAt) })
	return out
}

// Counts are the loads and evictions since the serve started.
func (m *Manager) Counts() (loads, evictions int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loads, m.evicts
}

// Budget is the configured budget per device.
func (m *Manager) Budget() int64 { return m.cfg.Budget }

// describe asks the model's ranks for their leases, bytes and last use.
func (m *Manager) describe(ctx context.Context, e *entry) Status {
	mo := e.Status
	mo.State, mo.LastUsed = "ready", mo.LoadedAt
	m.mu.Lock()
	mo.DropWhenUnused = e.unused
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ranks, err := status.All(ctx, e.SocketDir)
	if err != nil {
		mo.State, mo.Error = "unreachable", err.Error()
		return mo
	}
	for _, r := range ranks {
		if r.State != "ready" && mo.State == "ready" {
			mo.State, mo.Error = r.State, r.Error
		}
		mo.Leases += r.Leases
		mo.Bytes = max(mo.Bytes, r.Bytes)
		mo.Tensors = max(mo.Tensors, r.Tensors) // a staged model's, once published
		if r.LastUsed.After(mo.LastUsed) {
			mo.LastUsed = r.LastUsed
		}
	}
	return mo
}

// tailBuffer keeps the last 2 KiB written: a failed preload's reason.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}
