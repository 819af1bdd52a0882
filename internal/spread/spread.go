// Package spread owns a build spread over several BuildKit daemons: it
// deals the build's platforms to the daemons, runs one session.Images per
// daemon, checks that every part read the same tree, merges each image's
// parts (package ocimerge) into the bytes one daemon writes, and replaces
// the old tarballs only once every part is merged.
package spread

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/ocimerge"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// Images builds the images on the daemons opts names (Options.Daemon,
// else BUILDKIT_HOST): on one through session.Images; on several, to the
// bytes one would write. The build's platforms are dealt to the daemons
// (Deal), each daemon builds its platforms of every image into a folder
// of its own, and each image's parts are merged (package ocimerge). The
// tarballs replace the old ones once every part is built and every image
// merged; a daemon that fails fails the build, naming it, and writes
// nothing, unless Options.RetryElsewhere builds its platforms on another.
// The parts must have read the same sources and stamp: a tree edited
// while the daemons build fails the build too.
func Images(ctx context.Context, opts session.Options) (*session.ImagesOutcome, error) {
	hosts := Daemons(opts)
	if len(hosts) < 2 {
		return session.Images(ctx, opts)
	}
	p, err := session.Plan(opts)
	if err != nil {
		return nil, err
	}
	shares, err := Split(opts, p, hosts)
	if err != nil {
		return nil, err
	}
	dir := session.ImagesDir(opts, p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Swept by the next build if this one is killed.
	work, err := atomicfile.Temp(filepath.Join(dir, ".spread"), true)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	outs := make([]*session.ImagesOutcome, len(shares))
	reads := make([]Read, len(shares))
	err = Run(ctx, shares, hosts, opts.RetryElsewhere, func(ctx context.Context, i int, sh Share) error {
		dir, err := os.MkdirTemp(work, "part-")
		if err != nil {
			return err
		}
		o := sh.Options
		o.OutDir, o.Part = dir, true
		out, err := session.Images(ctx, o)
		if err != nil {
			return err
		}
		outs[i], reads[i] = out, Read{Host: sh.Host, Sources: out.Sources, Stamp: out.Stamp}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := SameTree(reads); err != nil {
		return nil, err
	}

	out := &session.ImagesOutcome{}
	for _, o := range outs {
		out.Steps = out.Steps.Plus(o.Steps)
		out.Explanations = append(out.Explanations, o.Explanations...)
	}
	merged := filepath.Join(work, "merged")
	if err := os.Mkdir(merged, 0o755); err != nil {
		return nil, err
	}
	for _, img := range p.Images {
		var tarballs []string
		for _, o := range outs {
			for _, r := range o.Images {
				if r.Name == img.Name {
					tarballs = append(tarballs, r.Path)
				}
			}
		}
		desc, err := ocimerge.Merge(ctx, inspect.ImagePath(merged, img.Name), tarballs, img.Targets)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", img.Name, err)
		}
		out.Images = append(out.Images, session.ImageResult{Name: img.Name, Ref: img.Ref, Digest: desc.Digest.String(),
			Path: inspect.ImagePath(dir, img.Name), Platforms: img.PlatformIDs()})
	}
	if err := replaceAll(merged, filepath.Join(work, "old"), out.Images); err != nil {
		return nil, err
	}
	return out, nil
}

// Share is one daemon's share of a spread build: its platforms of every
// image that has them, and the options that build them there.
type Share struct {
	Host      string
	Platforms []string
	Options   session.Options
}

// Split deals the plan's platforms to the daemons (Deal) and returns a
// share for each daemon given any, whose options build its platforms on
// it with the others' progress (plain lines, one writer, each line led by
// its daemon's name: the step numbers of two daemons repeat). A spread build
// exports no layer cache or Go cache snapshot yet: each daemon's would
// replace the others'.
func Split(opts session.Options, p *plan.Plan, hosts []string) ([]Share, error) {
	for _, c := range []struct{ flag, field, value string }{
		{"-cacheto", "cache.to", cmp.Or(opts.CacheTo, p.Cache.To)},
		{"-gocacheto", "cache.gocacheTo", cmp.Or(opts.GoCacheTo, p.Cache.GoCacheTo)},
	} {
		// An isolated release exports none (session.Options.Release).
		if c.value != "" && (!opts.Release || opts.TrustCaches) {
			return nil, fmt.Errorf("%s names %d daemons, and a build spread over several exports no cache yet (each daemon's would replace the others'): leave %s and %s unset, or name one daemon", buildkit.HostEnv, len(hosts), c.flag, c.field)
		}
	}
	mode, err := opts.ProgressMode()
	if err != nil {
		return nil, err
	}
	if mode == "auto" || mode == "tty" {
		mode = "plain" // one display per daemon, so lines, not a screen
	}
	for i, h := range hosts {
		if slices.Index(hosts, h) < i {
			return nil, fmt.Errorf("%s names %s twice: name each daemon once", buildkit.HostEnv, h)
		}
	}
	// Only the platforms some image built has: a daemon given another
	// would have no image to build.
	var built []string
	for _, id := range p.PlatformIDs() {
		if slices.ContainsFunc(p.Images, func(img plan.Image) bool { return slices.Contains(img.PlatformIDs(), id) }) {
			built = append(built, id)
		}
	}
	progress := &lockedWriter{w: cmp.Or[io.Writer](opts.ProgressOut, os.Stderr), names: names(hosts)}
	var shares []Share
	for i, platforms := range Deal(built, hosts, p.Builders) {
		var images []string
		for _, img := range p.Images {
			if slices.ContainsFunc(img.PlatformIDs(), func(id string) bool { return slices.Contains(platforms, id) }) {
				images = append(images, img.Name)
			}
		}
		if len(images) == 0 {
			continue
		}
		o := opts
		o.Daemon, o.Platforms, o.Images = hosts[i], strings.Join(platforms, ","), images
		o.Progress, o.ProgressOut, o.SnapshotTargets = mode, progress, p.PlatformIDs()
		if mode == "plain" {
			o.ProgressOut = progress.lines(hosts[i])
		}
		shares = append(shares, Share{Host: hosts[i], Platforms: platforms, Options: o})
	}
	return shares, nil
}

// Failed names the daemon and platforms of a share that failed.
func (sh Share) Failed(err error) error {
	return fmt.Errorf("the daemon at %s, building %s: %w", sh.Host, strings.Join(sh.Platforms, ", "), err)
}

// replaceAll moves the merged tarballs into place, the old ones aside
// first, and puts the old ones back if any move fails.
func replaceAll(merged, old string, images []session.ImageResult) error {
	if err := os.Mkdir(old, 0o755); err != nil {
		return err
	}
	var moved []session.ImageResult
	undo := func(err error) error {
		for _, r := range moved {
			os.Remove(r.Path)
			os.Rename(inspect.ImagePath(old, r.Name), r.Path)
		}
		return err
	}
	for _, r := range images {
		if err := os.Rename(r.Path, inspect.ImagePath(old, r.Name)); err != nil && !os.IsNotExist(err) {
			return undo(err)
		}
		moved = append(moved, r)
		if err := os.Rename(inspect.ImagePath(merged, r.Name), r.Path); err != nil {
			return undo(err)
		}
	}
	return nil
}

// Read is what one daemon's part of a spread build read of the tree:
// each binary file's digest, and the stamp.
type Read struct {
	Host    string
	Sources map[string]string
	Stamp   plan.Stamp
}

// ReadBy is what a part's session read of the tree once its work is done:
// before, the source digests it read at the start, which must still be the
// session's, and its stamp.
func ReadBy(sh Share, s *session.Session, before map[string]string) (Read, error) {
	if !maps.Equal(before, s.SourceDigests()) {
		return Read{}, fmt.Errorf("the tree changed while the daemon read it; build again")
	}
	return Read{Host: sh.Host, Sources: before, Stamp: s.Plan.Stamp}, nil
}

// SameTree refuses parts that read a source file differently, or were
// stamped differently: the tree changed between the daemons' reads.
func SameTree(reads []Read) error {
	seen := map[string]string{}
	from := map[string]string{}
	for i, r := range reads {
		if i > 0 && !reflect.DeepEqual(reads[0].Stamp, r.Stamp) {
			s0, s := reads[0].Stamp, r.Stamp
			return fmt.Errorf("the daemons at %s and %s stamped the build differently (%s %s %s, %s %s %s): the tree changed while they built it; build again", reads[0].Host, r.Host,
				s0.Version, s0.Commit, s0.TreeState, s.Version, s.Commit, s.TreeState)
		}
		for _, file := range slices.Sorted(maps.Keys(r.Sources)) {
			digest := r.Sources[file]
			if d, ok := seen[file]; ok && d != digest {
				return fmt.Errorf("the daemons at %s and %s were sent different %s: the tree changed while they built it; build again", from[file], r.Host, file)
			}
			seen[file], from[file] = digest, r.Host
		}
	}
	return nil
}

// lockedWriter lets the daemons' sessions print progress lines to one
// writer.
type lockedWriter struct {
	mu    sync.Mutex
	w     io.Writer
	names map[string]string
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lines is a writer whose whole lines reach l led by the daemon's name.
func (l *lockedWriter) lines(host string) *daemonLines {
	return &daemonLines{shared: l, prefix: []byte("[" + cmp.Or(l.names[host], host) + "] ")}
}

// names are the daemons' short names: the address's host (a pod's name,
// host:port) or socket path, or the whole address where two would share
// one.
func names(hosts []string) map[string]string {
	out := map[string]string{}
	taken := map[string]int{}
	for _, h := range hosts {
		name := h
		if u, err := url.Parse(h); err == nil && u.Host != "" {
			name = u.Host
		} else if err == nil && u.Path != "" {
			name = u.Path
		}
		out[h] = name
		taken[name]++
	}
	for h, name := range out {
		if taken[name] > 1 {
			out[h] = h
		}
	}
	return out
}

// daemonLines writes each whole line to the shared writer with the
// daemon's name before it; a share's solves may write at once.
type daemonLines struct {
	mu     sync.Mutex
	shared *lockedWriter
	prefix []byte
	buf    []byte
}

func (w *daemonLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < 64<<10 {
			return len(p), nil
		}
		if i < 0 {
			i = len(w.buf) - 1 // a line that never ends, shown in pieces
		}
		if _, err := w.shared.Write(append(slices.Clip(w.prefix), w.buf[:i+1]...)); err != nil {
			return 0, err
		}
		w.buf = w.buf[i+1:]
	}
}

// flush writes what is left of an unfinished line: a daemon that went
// away mid-line.
func (w *daemonLines) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.shared.Write(append(append(slices.Clip(w.prefix), w.buf...), '\n'))
		w.buf = nil
	}
}

// Daemons is the daemons a build runs on: Options.Daemon, else
// BUILDKIT_HOST's list, else none named (the managed local daemon).
func Daemons(opts session.Options) []string {
	if opts.Daemon != "" {
		return []string{opts.Daemon}
	}
	return buildkit.Hosts(os.Getenv(buildkit.HostEnv))
}

// Run builds every share on its daemon with build, which is given the
// share's index; the first to fail stops the others. With retry, the others
// go on instead, and each failed share is built again on the daemon that
// finished with the fewest platforms (one given none when none finished),
// its Host and Options.Daemon changed; Run fails when that fails too, when
// no daemon is left, or when ctx is cancelled. A share that failed because
// a step did (buildkit.BuildFailed: a compile error) is not retried.
func Run(ctx context.Context, shares []Share, hosts []string, retry bool, build func(ctx context.Context, i int, sh Share) error) error {
	try := func(ctx context.Context, i int, sh Share) error {
		err := build(ctx, i, sh)
		if lines, ok := sh.Options.ProgressOut.(*daemonLines); ok {
			lines.flush()
		}
		if err != nil {
			return sh.Failed(err)
		}
		return nil
	}
	if !retry {
		g, gctx := errgroup.WithContext(ctx)
		for i, sh := range shares {
			g.Go(func() error { return try(gctx, i, sh) })
		}
		return g.Wait()
	}
	errs := make([]error, len(shares))
	var wg sync.WaitGroup
	for i, sh := range shares {
		wg.Go(func() { errs[i] = try(ctx, i, sh) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return errors.Join(append([]error{err}, errs...)...)
	}
	for _, err := range errs {
		if buildkit.BuildFailed(err) {
			return fmt.Errorf("%w (a step failed, as it would on any daemon: not retried)", err)
		}
	}
	load := map[string]int{}
	for i, sh := range shares {
		if errs[i] == nil {
			load[sh.Host] = len(sh.Platforms)
		}
	}
	if len(load) == 0 {
		for _, h := range hosts {
			if !slices.ContainsFunc(shares, func(sh Share) bool { return sh.Host == h }) {
				load[h] = 0
			}
		}
	}
	if len(load) == 0 {
		return fmt.Errorf("no daemon finished, so none could build the others' platforms: %w", errors.Join(errs...))
	}
	for i, sh := range shares {
		if errs[i] == nil {
			continue
		}
		host := ""
		for _, h := range hosts {
			if n, ok := load[h]; ok && (host == "" || n < load[host]) {
				host = h
			}
		}
		log.G(ctx).Warnf("%v; building %s on the daemon at %s instead (-retryelsewhere)", errs[i], strings.Join(sh.Platforms, ", "), host)
		sh.Host, sh.Options.Daemon = host, host
		if lines, ok := sh.Options.ProgressOut.(*daemonLines); ok {
			sh.Options.ProgressOut = lines.shared.lines(host)
		}
		if err := try(ctx, i, sh); err != nil {
			return fmt.Errorf("%w; then, retried elsewhere: %w", errs[i], err)
		}
		load[host] += len(sh.Platforms)
	}
	return nil
}

// Deal gives each platform (in plan order) to a daemon: a platform some
// builder prefers to the least loaded of the daemons preferring it, the
// others then to the least loaded daemon, the first on a tie. Without
// preferences that is round-robin in list order.
func Deal(platformIDs, hosts []string, builders []config.Builder) [][]string {
	prefers := map[string][]int{}
	for i, h := range hosts {
		for _, b := range builders {
			if b.Address == h {
				for _, id := range b.Platforms {
					prefers[id] = append(prefers[id], i)
				}
			}
		}
	}
	dealt := make([][]string, len(hosts))
	least := func(among []int) int {
		best := among[0]
		for _, i := range among[1:] {
			if len(dealt[i]) < len(dealt[best]) {
				best = i
			}
		}
		return best
	}
	all := make([]int, len(hosts))
	for i := range all {
		all[i] = i
	}
	given := map[string]bool{}
	for _, id := range platformIDs {
		if among := prefers[id]; len(among) > 0 {
			i := least(among)
			dealt[i], given[id] = append(dealt[i], id), true
		}
	}
	for _, id := range platformIDs {
		if !given[id] {
			i := least(all)
			dealt[i] = append(dealt[i], id)
		}
	}
	for _, d := range dealt {
		slices.SortFunc(d, func(a, b string) int { return slices.Index(platformIDs, a) - slices.Index(platformIDs, b) })
	}
	return dealt
}
