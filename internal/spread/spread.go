// Package spread owns a build spread over several BuildKit daemons: it
// deals the build's platforms to the daemons, runs one session.Images per
// daemon, checks that every part read the same tree, merges each image's
// parts (package ocimerge) into the bytes one daemon writes, and replaces
// the old tarballs only once every part is merged.
package spread

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/ocimerge"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// Images builds the images on the daemons opts names (Options.Daemon,
// else BUILDKIT_HOST): on one, as session.Images does; on several, as
// session.Images would build them on one: the build's platforms are dealt to the daemons in plan order,
// each daemon builds its platforms of every image into a folder of its
// own, and each image's parts are merged (package ocimerge) into the
// layout one daemon would write, with the same digest. The layouts replace
// the old ones once every daemon succeeded and every image merged; a
// daemon that fails fails the build, naming it, and writes nothing. The
// parts must have read the same sources and stamp: a tree edited while the
// daemons build fails the build too.
func Images(ctx context.Context, opts session.Options) (*session.ImagesOutcome, error) {
	hosts := Daemons(opts)
	if len(hosts) < 2 {
		return session.Images(ctx, opts)
	}
	p, err := session.Plan(opts)
	if err != nil {
		return nil, err
	}
	// Each daemon would export its own platforms over the others'.
	for _, c := range []struct{ flag, field, value string }{
		{"-cacheto", "cache.to", cmp.Or(opts.CacheTo, p.Cache.To)},
		{"-gocacheto", "cache.gocacheTo", cmp.Or(opts.GoCacheTo, p.Cache.GoCacheTo)},
	} {
		if c.value != "" {
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
	dealt := make([][]string, len(hosts))
	for i, platform := range p.PlatformIDs() {
		dealt[i%len(hosts)] = append(dealt[i%len(hosts)], platform)
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
	progressOut := &lockedWriter{w: opts.ProgressOut}
	if progressOut.w == nil {
		progressOut.w = os.Stderr
	}

	outcomes := make([]*session.ImagesOutcome, len(hosts))
	g, gctx := errgroup.WithContext(ctx)
	for i, host := range hosts {
		var images []string
		for _, img := range p.Images {
			if slices.ContainsFunc(img.PlatformIDs(), func(id string) bool { return slices.Contains(dealt[i], id) }) {
				images = append(images, img.Name)
			}
		}
		if len(images) == 0 {
			continue
		}
		o := opts
		o.Daemon, o.Platforms, o.Images, o.Progress = host, strings.Join(dealt[i], ","), images, mode
		o.OutDir, o.ProgressOut, o.Part = filepath.Join(work, strconv.Itoa(i)), progressOut, true
		g.Go(func() error {
			out, err := session.Images(gctx, o)
			if err != nil {
				return fmt.Errorf("the daemon at %s, building %s: %w", host, strings.Join(dealt[i], ", "), err)
			}
			outcomes[i] = out
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := sameSources(hosts, outcomes); err != nil {
		return nil, err
	}

	out := &session.ImagesOutcome{}
	for _, o := range outcomes {
		if o != nil {
			out.Steps = out.Steps.Plus(o.Steps)
			out.Explanations = append(out.Explanations, o.Explanations...)
		}
	}
	merged := filepath.Join(work, "merged")
	if err := os.Mkdir(merged, 0o755); err != nil {
		return nil, err
	}
	for _, img := range p.Images {
		var parts []string
		for _, o := range outcomes {
			for _, r := range imagesNamed(o, img.Name) {
				parts = append(parts, r.Path)
			}
		}
		desc, err := ocimerge.Merge(ctx, inspect.ImagePath(merged, img.Name), parts, img.Targets)
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

// sameSources refuses parts that read a source file differently, or were
// stamped differently: the tree changed between the daemons' reads.
func sameSources(hosts []string, outcomes []*session.ImagesOutcome) error {
	seen := map[string]string{}
	from := map[string]string{}
	var stamp *plan.Stamp
	for i, o := range outcomes {
		if o == nil {
			continue
		}
		if stamp != nil && !reflect.DeepEqual(*stamp, o.Stamp) {
			return fmt.Errorf("the daemons at %s and %s stamped the build differently (%s %s %s, %s %s %s): the tree changed while they built it; build again", from["stamp"], hosts[i],
				stamp.Version, stamp.Commit, stamp.TreeState, o.Stamp.Version, o.Stamp.Commit, o.Stamp.TreeState)
		}
		if stamp == nil {
			stamp, from["stamp"] = &o.Stamp, hosts[i]
		}
		for _, file := range slices.Sorted(maps.Keys(o.Sources)) {
			digest := o.Sources[file]
			if d, ok := seen[file]; ok && d != digest {
				return fmt.Errorf("the daemons at %s and %s were sent different %s: the tree changed while they built it; build again", from[file], hosts[i], file)
			}
			seen[file], from[file] = digest, hosts[i]
		}
	}
	return nil
}

// lockedWriter lets the daemons' sessions print progress lines to one
// writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func imagesNamed(o *session.ImagesOutcome, name string) []session.ImageResult {
	if o == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(o.Images), func(r session.ImageResult) bool { return r.Name != name })
}

// Daemons is the daemons a build runs on: Options.Daemon, else
// BUILDKIT_HOST's list, else none named (the managed local daemon).
func Daemons(opts session.Options) []string {
	if opts.Daemon != "" {
		return []string{opts.Daemon}
	}
	return buildkit.Hosts(os.Getenv(buildkit.HostEnv))
}
