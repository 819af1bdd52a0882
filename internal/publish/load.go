package publish

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/moby/buildkit/client"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/containerd"
	"github.com/kiln-build/kiln/internal/session"
)

// LoadOptions say where images are loaded.
type LoadOptions struct {
	// Address is containerd's socket; CONTAINERD_ADDRESS, then the default.
	Address string
	// Namespace defaults to k8s.io, where the kubelet looks.
	Namespace string
}

func (o LoadOptions) namespace() string {
	if o.Namespace == "" {
		return containerd.DefaultNamespace
	}
	return o.Namespace
}

// LoadResult is one image in containerd.
type LoadResult struct {
	Name   string `json:"name"`
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// Load builds every image and streams each export straight into
// containerd's import (no copy on disk), then checks that containerd holds
// the index digest BuildKit exported.
func Load(ctx context.Context, opts session.Options, lopts LoadOptions) ([]LoadResult, error) {
	address := containerd.Address(lopts.Address)
	c, err := containerd.Connect(ctx, address) // before building: a missing socket fails fast
	if err != nil {
		return nil, err
	}
	defer c.Close()
	s, err := session.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()

	eg, egCtx := errgroup.WithContext(ctx)
	var jobs []buildkit.Job
	var writers []*io.PipeWriter
	results := make([]LoadResult, len(s.Plan.Images))
	for i, img := range s.Plan.Images {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		eg.Go(func() error {
			imported, err := containerd.Import(egCtx, c, lopts.namespace(), pr)
			pr.CloseWithError(err)
			if err != nil {
				return err
			}
			for _, im := range imported {
				if strings.HasSuffix(im.Name, "/"+img.Ref) || im.Name == img.Ref {
					results[i] = LoadResult{Name: img.Name, Ref: im.Name, Digest: im.Target.Digest.String()}
				}
			}
			if results[i].Ref == "" {
				return fmt.Errorf("containerd imported %s without the name %s", img.Name, img.Ref)
			}
			return nil
		})
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.Build(img),
			FrontendAttrs: map[string]string{"platform": strings.Join(img.PlatformIDs(), ",")},
			Export: client.ExportEntry{Type: client.ExporterOCI, Attrs: s.ExporterAttrs(img.Ref, img.HasBase()),
				Output: func(map[string]string) (io.WriteCloser, error) { return pw, nil }},
		})
	}
	out, solveErr := s.SolveImages(ctx, jobs)
	if solveErr != nil {
		// Unblock the importers; their errors say less than the solve's.
		for _, pw := range writers {
			pw.CloseWithError(solveErr)
		}
		eg.Wait()
		return nil, solveErr
	}
	if err := eg.Wait(); err != nil {
		return nil, err
	}
	for i, r := range out.Results {
		if results[i].Digest != r.Digest {
			return nil, fmt.Errorf("%s: containerd holds %s but BuildKit exported %s", results[i].Ref, results[i].Digest, r.Digest)
		}
	}
	log.G(ctx).Infof("loaded %d images into containerd %s, namespace %s", len(results), address, lopts.namespace())
	return results, nil
}

// SmokeResult is one binary run under containerd.
type SmokeResult struct {
	Image    string `json:"image"`
	Platform string `json:"platform"`
	Binary   string `json:"binary"`
	Output   string `json:"output,omitempty"`
	// Skipped says why a platform could not run here; empty when it ran.
	Skipped string `json:"skipped,omitempty"`
	Err     string `json:"error,omitempty"`
}

// Smoke runs `<binary> --version` for every binary of every loaded image on
// every platform this machine can execute (arm through qemu binfmt), and
// checks the output against the plan: version, commit, platform, cgo off.
func Smoke(ctx context.Context, opts session.Options, lopts LoadOptions) ([]SmokeResult, error) {
	p, err := session.Plan(opts)
	if err != nil {
		return nil, err
	}
	c, err := containerd.Connect(ctx, containerd.Address(lopts.Address))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var results []SmokeResult
	for _, img := range p.Images {
		ref := img.Ref
		if !strings.Contains(strings.SplitN(ref, "/", 2)[0], ".") {
			ref = "docker.io/" + ref
		}
		for _, target := range img.Targets {
			plat := platforms.Format(target)
			ok, why := containerd.Runnable(target)
			for _, b := range img.Binaries {
				r := SmokeResult{Image: img.Name, Platform: plat, Binary: b}
				if !ok {
					r.Skipped = why
					results = append(results, r)
					continue
				}
				out, err := containerd.Run(ctx, c, lopts.namespace(), ref, target, "/usr/local/bin/"+b, "--version")
				r.Output = strings.TrimSpace(out)
				if err != nil {
					r.Err = err.Error()
				} else {
					for _, want := range []string{b + " version " + p.Stamp.Version, "commit " + p.Stamp.Commit, plat, "cgo=off"} {
						if !strings.Contains(r.Output, want) {
							r.Err = fmt.Sprintf("output does not say %q", want)
							break
						}
					}
				}
				results = append(results, r)
			}
		}
	}
	return results, nil
}
