package managed

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
)

// Status writes the daemon's address, version, workers and disk use by kind.
// It never starts a daemon.
func Status(ctx context.Context, repoRoot string, w io.Writer) error {
	addr := os.Getenv(buildkit.HostEnv)
	if hosts := buildkit.Hosts(addr); len(hosts) > 1 {
		for _, h := range hosts {
			if err := statusOf(ctx, h, nil, w); err != nil {
				return err
			}
		}
		return nil
	}
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
	return statusOf(ctx, addr, m, w)
}

// statusOf writes the status of the daemon at addr, the managed one m if
// not nil.
func statusOf(ctx context.Context, addr string, m *Managed, w io.Writer) error {
	c, err := buildkit.Dial(ctx, addr)
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
			plats = append(plats, config.FormatPlatform(p))
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

// keptKind says what Prune keeps of a record unless told to remove
// everything: all Go cache mounts (but an isolated rebuild's, left by an
// interrupted run, and the go steps' /tmp), which make the next cold build fast, and all the local
// sources' transfer state, so the next build sends only what changed of the
// toolchain (135 MB) and the repository (kindAll); and the last used module
// layer, which would otherwise be copied again from the module cache and
// hashed, file by file (seconds for a large module graph; it was minutes
// when every module was unzipped again), kiln's step tool, which would be
// linked again, the unpacked toolchain and the unpacked vendor/ archive
// (kindNewest, one of each). The standard library steps' records are empty
// and kept: their work is in the Go cache mount, and without them the next
// build would wait for go to check every standard package again.
func keptKind(u *client.UsageInfo) (kind string, newestOnly bool) {
	switch {
	case u.RecordType == client.UsageRecordTypeCacheMount && strings.Contains(u.Description, `with id "`+golang.IsolatedCachePrefix):
		// An isolated rebuild's Go cache that an interrupted run left.
		return "", false
	case u.RecordType == client.UsageRecordTypeCacheMount && strings.Contains(u.Description, `with id "`+golang.GoTmpCacheID+`"`):
		// go's work folders, which only a killed go leaves there.
		return "", false
	case u.RecordType == client.UsageRecordTypeCacheMount, u.RecordType == client.UsageRecordTypeLocalSource:
		return string(u.RecordType), false
	case strings.HasPrefix(u.Description, "mount "+golang.StdDir+" from exec "):
		return "standard library", false
	case strings.HasPrefix(u.Description, "mount "+golang.ModuleLayerDir+" from exec "):
		return "module layer", true
	case strings.HasPrefix(u.Description, "mount "+golang.ToolsDir+" from exec "):
		return "step tool", true
	case strings.HasPrefix(u.Description, golang.ToolchainStep):
		return "toolchain", true
	case u.Description == golang.VendorStep:
		return "vendor", true
	}
	return "", false
}

// PruneUnkept removes every record Prune does not keep (see keptKind),
// sending each removed one to ch when it is not nil.
func PruneUnkept(ctx context.Context, d *buildkit.Daemon, ch chan client.UsageInfo) error {
	return pruneIDs(ctx, d, ch, unkept)
}

// PruneAllButTools removes every record but the tools a build runs with
// (toolRecord), sending each removed one to ch when it is not nil. The
// bench's cold build starts from it, as native's starts with Go installed:
// no cache mount, module, source or output is left.
func PruneAllButTools(ctx context.Context, d *buildkit.Daemon, ch chan client.UsageInfo) error {
	return pruneIDs(ctx, d, ch, func(usage []*client.UsageInfo) []string {
		var ids []string
		for _, u := range usage {
			if !toolRecord(u) {
				ids = append(ids, u.ID)
			}
		}
		return ids
	})
}

// pruneIDs removes the records that remove picks from the daemon's.
func pruneIDs(ctx context.Context, d *buildkit.Daemon, ch chan client.UsageInfo, remove func([]*client.UsageInfo) []string) error {
	usage, err := d.DiskUsage(ctx)
	if err != nil {
		return err
	}
	var filters []string
	for _, id := range remove(usage) {
		filters = append(filters, "id=="+id)
	}
	if len(filters) == 0 {
		return nil
	}
	return d.Prune(ctx, ch, client.PruneAll, client.WithFilter(filters))
}

// toolRecord says whether a record holds a tool rather than a build's work:
// the unpacked toolchain, kiln's step tool, git and ssh for the download
// step, and the transfer state of the archives they come from and of the
// CA bundle. A host keeps their like installed.
func toolRecord(u *client.UsageInfo) bool {
	switch u.RecordType {
	case client.UsageRecordTypeLocalSource:
		for _, name := range []string{golang.LocalToolchain, golang.LocalStepTool, golang.LocalVCSTools, golang.LocalCACerts} {
			if u.Description == "local source for "+name {
				return true
			}
		}
		return false
	case client.UsageRecordTypeRegular:
		return strings.HasPrefix(u.Description, golang.ToolchainStep) || u.Description == golang.VCSToolsStep ||
			strings.HasPrefix(u.Description, "mount "+golang.ToolsDir+" from exec ")
	}
	return false
}

// unkept are the ids of the records Prune removes.
func unkept(usage []*client.UsageInfo) []string {
	newest := map[string]*client.UsageInfo{}
	for _, u := range usage {
		if kind, only := keptKind(u); only {
			if n := newest[kind]; n == nil || lastUsed(u).After(lastUsed(n)) {
				newest[kind] = u
			}
		}
	}
	var ids []string
	for _, u := range usage {
		if kind, only := keptKind(u); kind == "" || only && newest[kind] != u {
			ids = append(ids, u.ID)
		}
	}
	return ids
}

func lastUsed(u *client.UsageInfo) time.Time {
	if u.LastUsedAt != nil {
		return *u.LastUsedAt
	}
	return u.CreatedAt
}

// Prune frees the daemon's build cache, keeping what keptKind says unless
// all is set.
func Prune(ctx context.Context, repoRoot string, all bool, w io.Writer) error {
	d, err := Connect(ctx, repoRoot)
	if err != nil {
		return err
	}
	defer d.Close()
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
	if all {
		err = d.Prune(ctx, ch, client.PruneAll)
	} else {
		err = PruneUnkept(ctx, d, ch)
	}
	close(ch)
	<-done
	if err != nil {
		return fmt.Errorf("prune %s: %w", d.Address, err)
	}
	kept := " (Go cache mounts, local transfer state, the last module layer, the unpacked toolchain and vendor/, and kiln's step tool kept; -all removes them too)"
	if all {
		kept = ""
	}
	fmt.Fprintf(w, "pruned %d records, %s freed%s\n", records, config.FormatSize(freed), kept)
	return nil
}

// Connect dials BUILDKIT_HOST when it is set, and otherwise the managed
// local daemon, starting it if needed.
func Connect(ctx context.Context, repoRoot string) (*buildkit.Daemon, error) {
	return ConnectTo(ctx, repoRoot, os.Getenv(buildkit.HostEnv))
}

// ConnectTo dials the daemon at addr, or the managed local one when addr
// is empty. A list of several (BUILDKIT_HOST=A,B) is for the builds that
// spread over daemons, which connect to each.
func ConnectTo(ctx context.Context, repoRoot, addr string) (*buildkit.Daemon, error) {
	switch hosts := buildkit.Hosts(addr); {
	case len(hosts) > 1:
		return nil, fmt.Errorf("%s=%s names %d daemons; only images, images:push, images:resolve and release spread a build over several so far: name one daemon for this target", buildkit.HostEnv, addr, len(hosts))
	case len(hosts) == 0 && addr != "":
		return nil, fmt.Errorf("%s=%q names no daemon; give its address, e.g. tcp://HOST:1234, or unset it for the managed one", buildkit.HostEnv, addr)
	case len(hosts) == 1:
		addr = hosts[0]
	}
	if addr != "" {
		c, err := buildkit.Dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &buildkit.Daemon{Client: c, Address: addr}, nil
	}
	m, err := DefaultManaged(repoRoot)
	if err != nil {
		return nil, err
	}
	c, err := m.Ensure(ctx)
	if err != nil {
		return nil, err
	}
	return &buildkit.Daemon{Client: c, Address: m.Address(), Managed: m}, nil
}
