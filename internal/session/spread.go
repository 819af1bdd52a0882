package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/ocimerge"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// spreadImages builds the images on several daemons, as Images builds them
// on one: the build's platforms are dealt to the daemons in plan order,
// each daemon builds its platforms of every image into a folder of its
// own, and each image's parts are merged (package ocimerge) into the
// layout one daemon would write, with the same digest. The layouts replace
// the old ones once every daemon succeeded and every image merged; a
// daemon that fails fails the build, naming it, and writes nothing.
func spreadImages(ctx context.Context, opts Options, hosts []string) (*ImagesOutcome, error) {
	p, err := Plan(opts)
	if err != nil {
		return nil, err
	}
	mode, err := opts.progress()
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
	dir := ImagesDir(opts, p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(dir, ".spread-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	outcomes := make([]*ImagesOutcome, len(hosts))
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
		o.OutDir = filepath.Join(work, strconv.Itoa(i))
		g.Go(func() error {
			out, err := Images(gctx, o)
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

	out := &ImagesOutcome{}
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
			for _, r := range o.imagesNamed(img.Name) {
				parts = append(parts, r.Path)
			}
		}
		desc, err := ocimerge.Merge(ctx, inspect.ImagePath(merged, img.Name), parts, img.Targets)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", img.Name, err)
		}
		out.Images = append(out.Images, ImageResult{Name: img.Name, Ref: img.Ref, Digest: desc.Digest.String(),
			Path: inspect.ImagePath(dir, img.Name), Platforms: img.PlatformIDs()})
	}
	for _, r := range out.Images {
		if err := os.Rename(inspect.ImagePath(merged, r.Name), r.Path); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (o *ImagesOutcome) imagesNamed(name string) []ImageResult {
	if o == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(o.Images), func(r ImageResult) bool { return r.Name != name })
}

// daemonsOf is the daemons a build runs on: Daemon, else BUILDKIT_HOST's
// list, else none named (the managed local daemon).
func daemonsOf(opts Options) []string {
	if opts.Daemon != "" {
		return []string{opts.Daemon}
	}
	return buildkit.Hosts(os.Getenv(buildkit.HostEnv))
}
