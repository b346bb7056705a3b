package commands

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{name: "status", summary: "show every daemon in the socket directory", run: runStatus,
		examples: []string{"weightcache status", "weightcache status --socket-dir /run/weightcache --json"}})
}

func runStatus(ctx context.Context, e env, args []string) error {
	fs := newFlags("status", e)
	socketDir := fs.String("socket-dir", sockets.DefaultDir(), "directory of the daemon sockets")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if _, err := os.Stat(sockets.ServePath(*socketDir)); err == nil {
		return managedStatus(ctx, e, *socketDir, *asJSON)
	}
	daemons, err := client.Status(ctx, *socketDir)
	if err != nil {
		return err
	}
	if *asJSON {
		if daemons == nil {
			daemons = []client.DaemonStatus{}
		}
		return json.NewEncoder(e.stdout).Encode(daemons)
	}
	if len(daemons) == 0 {
		fmt.Fprintf(e.stdout, "no daemons in %s\n", *socketDir)
		return nil
	}
	if err := writeStatusTable(e.stdout, daemons); err != nil {
		return err
	}
	if err := writeArtifacts(e.stdout, daemons); err != nil {
		return err
	}
	// A plan that matched too little is said once per rank, under the table.
	for _, d := range daemons {
		if p := d.Plan; p != nil && p.Unmatched > 0 {
			fmt.Fprintf(e.stdout, "%s: plan %s replicates %s on every rank; %d tensors (%s) match no rule, first: %s\n",
				d.Device, p.Plan, checkpoint.HumanBytes(p.ReplicatedBytes), p.Unmatched, checkpoint.HumanBytes(p.UnmatchedBytes), strings.Join(p.FirstUnmatched, ", "))
		}
	}
	return nil
}

// managedStatus shows a directory weightcache serve manages: its models,
// then every model's ranks.
func managedStatus(ctx context.Context, e env, dir string, asJSON bool) error {
	rep, err := models.Ask(ctx, dir, models.Request{Op: "list"})
	if err != nil {
		return err
	}
	var daemons []client.DaemonStatus
	for _, mo := range rep.Models {
		ds, err := client.Status(ctx, mo.SocketDir)
		if err != nil {
			return err
		}
		daemons = append(daemons, ds...)
	}
	if asJSON {
		if daemons == nil {
			daemons = []client.DaemonStatus{}
		}
		return json.NewEncoder(e.stdout).Encode(map[string]any{"budget": rep.Budget, "loads": rep.Loads, "evictions": rep.Evictions,
			"models": rep.Models, "daemons": daemons})
	}
	budget := "none"
	if rep.Budget > 0 {
		budget = checkpoint.HumanBytes(rep.Budget) + " on each device"
	}
	var held int64
	for _, mo := range rep.Models {
		held += max(mo.Bytes, mo.Need)
	}
	fmt.Fprintf(e.stdout, "weightcache serve in %s: %d models, %s held, budget %s; %d loads, %d evictions\n",
		dir, len(rep.Models), checkpoint.HumanBytes(held), budget, rep.Loads, rep.Evictions)
	if len(rep.Models) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tREVISION\tPUBLISHED BY\tDTYPE\tDEVICES\tSTATE\tBYTES\tTENSORS\tLEASES\tLAST USED\tKEY")
	for _, mo := range rep.Models {
		by, state := "-", mo.State
		if mo.Engine != "" {
			by = strings.TrimSpace(mo.Engine + " " + mo.EngineVersion)
		}
		if mo.DropWhenUnused {
			state += ", dropped once unused"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", mo.Model, cmp.Or(mo.Revision, "-"), by, mo.DType, mo.Devices, state,
			checkpoint.HumanBytes(max(mo.Bytes, mo.Need)), mo.Tensors, mo.Leases, mo.LastUsed.Local().Format(time.DateTime), mo.Key)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout)
	return writeStatusTable(e.stdout, daemons)
}

// writeStatusTable writes one row per daemon.
func writeStatusTable(w io.Writer, daemons []client.DaemonStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tGROUP\tSTATE\tPID\tMODEL\tDTYPE\tTP RANK\tDP RANK\tTENSORS\tBYTES\tLEASES\tHITS\tMISMATCHES")
	for _, d := range daemons {
		if d.State == "unreachable" {
			fmt.Fprintf(tw, "%s\t-\tunreachable\t-\t%s\t\t\t\t\t\t\t\t\n", d.Device, d.Error)
			continue
		}
		fp := d.Fingerprint
		size := checkpoint.HumanBytes(d.Bytes)
		if d.State == protocol.StateLoading {
			size = checkpoint.HumanBytes(d.LoadedBytes) + " of " + checkpoint.HumanBytes(d.TotalBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\n",
			d.Device, d.Group, d.State, d.PID, d.Model, fp.DType, rankOf(fp.TPRank, fp.TPSize), rankOf(fp.DPRank, fp.DPSize),
			d.Tensors, size, d.Leases, d.Handshakes[protocol.ResultHit], mismatchSummary(d.Mismatches))
	}
	return tw.Flush()
}

// writeArtifacts lists the compile artifact sets held, once: the ranks
// of a socket directory share one store, and each counts its own hits,
// which are summed here. Nothing is written when every budget is 0.
func writeArtifacts(w io.Writer, daemons []client.DaemonStatus) error {
	var budget, held int64
	type row struct {
		set  protocol.ArtifactSet
		hits int64
	}
	var rows []*row
	byID := map[[2]string]*row{}
	for _, d := range daemons {
		if d.ArtifactBudget == 0 {
			continue
		}
		if budget == 0 {
			budget, held = d.ArtifactBudget, d.ArtifactBytes
		}
		for _, a := range d.Artifacts {
			r := byID[[2]string{a.Dir, a.Rank}]
			if r == nil {
				r = &row{set: a}
				byID[[2]string{a.Dir, a.Rank}] = r
				rows = append(rows, r)
			}
			r.hits += a.Hits
		}
	}
	if budget == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nartifacts: %d sets, %s of %s (--artifact-budget)\n", len(rows), checkpoint.HumanBytes(held), checkpoint.HumanBytes(budget))
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRANK\tDIR\tFILES\tBYTES\tHITS\tLAST USED")
	for _, r := range rows {
		a := r.set
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\n", a.Key, a.Rank, a.Dir, a.Files, checkpoint.HumanBytes(a.Bytes), r.hits, a.LastUsed.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// rankOf writes a rank as "0 of 1": the "0/1" it replaced read as none
// of one.
func rankOf(rank, size int) string {
	return fmt.Sprintf("%d of %d", rank, size)
}

func mismatchSummary(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}
