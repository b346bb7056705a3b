package commands

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/launcher"
	"github.com/weightcache/weightcache/internal/plan"
)

// rankFlags are preload's parallelism, multi-node, draft and health flags,
// spelled as the engines spell them.
type rankFlags struct {
	tp, dp, dpStart, dpLocal         int
	nnodes, nodeRank                 int
	masterAddr                       string
	masterPort, wcPort, draftPort    int
	rendezvousTimeout                time.Duration
	shardingPlan, draftPlan          string
	strictPlan                       bool
	draftModel, draftDType, draftRev string
	healthHost                       string
	healthPort                       int
	lazy                             bool // checkpoints resolved without parsing their headers
}

func (r *rankFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&r.tp, "tensor-parallel-size", 1, "tensor-parallel size: each rank holds its slice of every split tensor")
	fs.IntVar(&r.dp, "data-parallel-size", 1, "data-parallel size")
	fs.IntVar(&r.dpStart, "data-parallel-start-rank", 0, "data-parallel rank of this node's first device")
	fs.IntVar(&r.dpLocal, "data-parallel-size-local", 0, "data-parallel ranks on this node (0: every rank from the start rank)")
	fs.IntVar(&r.nnodes, "nnodes", 1, "number of nodes, one preload per node")
	fs.IntVar(&r.nodeRank, "node-rank", 0, "this node's rank")
	fs.StringVar(&r.masterAddr, "master-addr", "127.0.0.1", "address of node 0, which hosts the rendezvous")
	fs.IntVar(&r.masterPort, "master-port", 0, "the engine's --master-port, to refuse a clash with the rendezvous port (0: not given)")
	fs.IntVar(&r.wcPort, "weight-cache-master-port", 29600, "rendezvous port of the main group on node 0")
	fs.IntVar(&r.draftPort, "draft-weight-cache-master-port", 29601, "rendezvous port of the draft group on node 0")
	fs.DurationVar(&r.rendezvousTimeout, "weight-cache-rendezvous-timeout", 5*time.Minute, "bound on each wait for the other nodes")
	fs.BoolVar(&r.strictPlan, "strict-plan", false, "refuse a tensor-parallel launch where a tensor matches no rule of the sharding plan (it would be replicated on every rank)")
	fs.StringVar(&r.shardingPlan, "sharding-plan", "", "JSON or YAML file of tensor-name patterns -> split kind and dim, for architectures without a built-in plan")
	fs.StringVar(&r.draftPlan, "draft-sharding-plan", "", "sharding plan file for the draft model (default: its architecture's built-in plan)")
	fs.StringVar(&r.draftModel, "draft-model", "", "draft model (MTP, EAGLE, EAGLE3) to serve as group draft on every device")
	fs.StringVar(&r.draftDType, "draft-dtype", "auto", "dtype of the draft model")
	fs.StringVar(&r.draftRev, "draft-revision", "", "revision of the draft model")
	fs.StringVar(&r.healthHost, "weight-cache-health-host", "127.0.0.1", "address of /health and /metrics")
	fs.IntVar(&r.healthPort, "weight-cache-health-port", 0, "port of /health and /metrics (0: off)")
}

// config checks the flags and resolves every group's checkpoint and plan.
func (r *rankFlags) config(fs *flag.FlagSet, p *preloadFlags) (launcher.Config, error) {
	cfg := launcher.Config{
		Layout:     launcher.Layout{TP: r.tp, DP: r.dp, DPStart: r.dpStart, DPLocal: r.dpLocal, NNodes: r.nnodes, NodeRank: r.nodeRank},
		Settings:   p.settings,
		MasterAddr: r.masterAddr, RendezvousTimeout: r.rendezvousTimeout,
	}
	if err := r.checkPorts(); err != nil {
		return cfg, err
	}
	devices := p.devices
	var err error
	if !flagSet(fs, "devices") {
		if devices, err = defaultDevices(r.tp * max(r.dpLocal, r.dp-r.dpStart) / max(r.nnodes, 1)); err != nil {
			return cfg, usageErrorf("%v", err)
		}
	}
	keys, err := resolveDevices(devices)
	if err != nil {
		return cfg, usageErrorf("--devices: %v", err)
	}
	if cfg.Devices, err = launcher.ParseDevices(strings.Join(keys, ",")); err != nil {
		return cfg, usageErrorf("%v", err)
	}
	if cfg.GPU, err = p.gpu.options(fs, p.settings.Workers); err != nil {
		return cfg, usageErrorf("%v", err)
	}
	if launcher.OnGPU(cfg.Devices) && r.tp > 1 && cfg.GPU.IPC == cuda.IPCLegacy {
		return cfg, usageErrorf("--tensor-parallel-size %d with --ipc legacy: legacy IPC memory dies with the process that allocated it, so each rank loads itself whole; use --ipc fd", r.tp)
	}
	if !flagSet(fs, "load-workers") && launcher.OnGPU(cfg.Devices) {
		cfg.Workers = gpuLoadWorkers
	}
	if _, err := launcher.Map(cfg.Devices, cfg.Layout); err != nil {
		return cfg, usageErrorf("%v", err)
	}
	// A preload that may be handed its segments (a takeover, or systemd's
	// fd store) needs the fingerprint at once and the tensors only for a
	// fresh load: at 100,000 tensors parsing the headers is most of a
	// takeover. With TP > 1 the plan is checked against them first.
	r.lazy = r.tp == 1 && (p.takeover || os.Getenv("LISTEN_FDS") != "")
	main, err := r.group("main", p.model, p.revision, p.dtype, r.shardingPlan, r.wcPort)
	if err != nil {
		return cfg, err
	}
	cfg.Groups = []launcher.Group{main}
	if r.draftModel != "" {
		draft, err := r.group("draft", r.draftModel, r.draftRev, r.draftDType, r.draftPlan, r.draftPort)
		if err != nil {
			return cfg, err
		}
		cfg.Groups = append(cfg.Groups, draft)
	}
	if r.healthPort != 0 {
		cfg.HealthAddr = net.JoinHostPort(r.healthHost, strconv.Itoa(r.healthPort))
	}
	return cfg, nil
}

func (r *rankFlags) checkPorts() error {
	if r.nnodes > 1 {
		for _, pp := range []struct {
			name string
			port int
		}{{"--weight-cache-master-port", r.wcPort}, {"--draft-weight-cache-master-port", r.draftPort}} {
			if pp.port <= 0 || pp.port > 65535 {
				return usageErrorf("%s %d: want a port from 1 to 65535", pp.name, pp.port)
			}
		}
	}
	if r.masterPort != 0 && r.wcPort == r.masterPort {
		return usageErrorf("--weight-cache-master-port %d equals the engine's --master-port: the rendezvous needs its own port", r.wcPort)
	}
	if r.draftModel != "" && r.masterPort != 0 && r.draftPort == r.masterPort {
		return usageErrorf("--draft-weight-cache-master-port %d equals the engine's --master-port", r.draftPort)
	}
	if r.draftModel != "" && r.nnodes > 1 && r.draftPort == r.wcPort {
		return usageErrorf("--draft-weight-cache-master-port %d equals --weight-cache-master-port: each group has its own rendezvous", r.draftPort)
	}
	return nil
}

// group resolves one group's checkpoint and, with TP > 1, its sharding
// plan, and checks that every split tensor divides.
func (r *rankFlags) group(name, model, revision, dtypeFlag, planFile string, port int) (launcher.Group, error) {
	dtype, err := checkpoint.NormalizeDType(dtypeFlag)
	if err != nil {
		return launcher.Group{}, usageErrorf("group %s: dtype: %v", name, err)
	}
	resolve := checkpoint.Resolve
	if r.lazy {
		resolve = checkpoint.ResolveLazily
	}
	ckpt, err := resolve(model, revision)
	if err != nil {
		return launcher.Group{}, err
	}
	if _, err := ckpt.Fingerprint(checkpoint.Request{Model: model, Revision: revision, DType: dtype, TPSize: 1, DPSize: 1}); err != nil {
		return launcher.Group{}, err
	}
	g := launcher.Group{Name: name, Model: model, Checkpoint: ckpt, DType: dtype, MasterPort: port}
	if r.tp == 1 {
		return g, nil
	}
	if planFile != "" {
		g.Plan, err = plan.Load(planFile)
	} else {
		g.Plan, err = plan.ForArchitecture(ckpt.Architecture)
	}
	if err != nil {
		return g, fmt.Errorf("group %s (%s): %w", name, model, err)
	}
	if g.Heads, err = plan.ReadModel(ckpt.Dir); err != nil {
		return g, err
	}
	return g, launcher.CheckPlan(&g, r.tp, r.strictPlan)
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
