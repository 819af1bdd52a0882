package buildkit

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/moby/buildkit/client"
)

// Status writes the daemon's address, version, workers and disk use by kind.
// It never starts a daemon.
func Status(ctx context.Context, repoRoot string, w io.Writer) error {
	addr := os.Getenv(HostEnv)
	var m *Managed
	if addr == "" {
		var err error
		if m, err = DefaultManaged(repoRoot); err != nil {
			return err
		}
		addr = m.Address()
		pid, running := m.Running()
		if !running {
			fmt.Fprintf(w, "managed buildkitd: not running (state %s; `mage images` starts it)\n", m.Dir)
			return nil
		}
		fmt.Fprintf(w, "managed buildkitd: pid %d, state %s, log %s\n", pid, m.Dir, m.LogFile())
	}
	c, err := Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(w, "address: %s\n", addr)
	if info, err := c.Info(ctx); err == nil {
		fmt.Fprintf(w, "buildkit: %s %s\n", info.BuildkitVersion.Package, info.BuildkitVersion.Version)
	}
	workers, err := c.ListWorkers(ctx)
	if err != nil {
		return err
	}
	for _, wk := range workers {
		var plats []string
		for _, p := range wk.Platforms {
			plats = append(plats, p.OS+"/"+p.Architecture+suffix(p.Variant))
		}
		fmt.Fprintf(w, "worker %s: %s (%s)\n", wk.ID, wk.Labels["org.mobyproject.buildkit.worker.executor"], strings.Join(plats, ", "))
	}
	usage, err := c.DiskUsage(ctx)
	if err != nil {
		return fmt.Errorf("disk usage of %s: %w", addr, err)
	}
	type kind struct {
		count       int
		size        int64
		reclaimable int64
	}
	byKind := map[string]*kind{}
	var total int64
	for _, u := range usage {
		k := byKind[string(u.RecordType)]
		if k == nil {
			k = &kind{}
			byKind[string(u.RecordType)] = k
		}
		k.count++
		k.size += u.Size
		if !u.InUse {
			k.reclaimable += u.Size
		}
		total += u.Size
	}
	names := make([]string, 0, len(byKind))
	for n := range byKind {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tRECORDS\tSIZE\tRECLAIMABLE")
	for _, n := range names {
		k := byKind[n]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", n, k.count, config.FormatSize(k.size), config.FormatSize(k.reclaimable))
	}
	fmt.Fprintf(tw, "total\t%d\t%s\t\n", len(usage), config.FormatSize(total))
	return tw.Flush()
}

// KeptByPrune is what Prune keeps unless told to remove everything: the Go
// cache mounts, which make the next cold build fast, and the local sources'
// transfer state, so the next build sends only what changed of the toolchain
// (135 MB) and the repository rather than all of it.
var KeptByPrune = client.WithFilter([]string{"type!=" + string(client.UsageRecordTypeCacheMount) + ",type!=" + string(client.UsageRecordTypeLocalSource)})

// Prune frees the daemon's build cache, keeping KeptByPrune unless all is set.
func Prune(ctx context.Context, repoRoot string, all bool, w io.Writer) error {
	d, err := Connect(ctx, repoRoot)
	if err != nil {
		return err
	}
	defer d.Close()
	opts := []client.PruneOption{client.PruneAll}
	if !all {
		opts = append(opts, KeptByPrune)
	}
	ch := make(chan client.UsageInfo)
	done := make(chan struct{})
	var freed int64
	var records int
	go func() {
		defer close(done)
		for u := range ch {
			freed += u.Size
			records++
		}
	}()
	err = d.Prune(ctx, ch, opts...)
	close(ch)
	<-done
	if err != nil {
		return fmt.Errorf("prune %s: %w", d.Address, err)
	}
	kept := " (Go cache mounts and local transfer state kept; -all removes them too)"
	if all {
		kept = ""
	}
	fmt.Fprintf(w, "pruned %d records, %s freed%s\n", records, config.FormatSize(freed), kept)
	return nil
}

func suffix(variant string) string {
	if variant == "" {
		return ""
	}
	return "/" + variant
}
