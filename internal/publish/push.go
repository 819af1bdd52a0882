package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/distribution/reference"
	"github.com/moby/buildkit/client"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// RegistryEnv names the registry to push to when no flag does.
const RegistryEnv = "REGISTRY"

// PushOptions say where images go.
type PushOptions struct {
	// Registry is host[:port][/path]; REGISTRY when empty.
	Registry string
	// Latest also tags each image latest.
	Latest bool
	// SkipTLSVerify sets BuildKit's registry.insecure: plain HTTP allowed
	// and certificates not checked. Loopback registries need no flag.
	SkipTLSVerify bool
	// ReadBack reads each pushed index back with kiln's own registry
	// client for its platform manifests (-metadata). A registry whose CA
	// only the daemon's configuration names cannot be read back.
	ReadBack bool
	// RetryElsewhere, with several daemons, pushes the platforms of a
	// daemon that failed from one that finished (spread.Run).
	RetryElsewhere bool
}

// PushResult is one pushed image.
type PushResult struct {
	Name   string   `json:"name"`
	Refs   []string `json:"refs"`
	Digest string   `json:"digest"`
	// Platforms are the index's platform manifests, as the registry has
	// them (read back only when asked: PushOptions.ReadBack, a release).
	Platforms []inspect.PlatformDigest `json:"platforms,omitempty"`
}

// Push builds every image and pushes it, all platforms in one index, tagged
// with the version (and latest when asked). With several daemons
// (BUILDKIT_HOST=A,B,...) the platforms are spread over them (pushSpread).
func Push(ctx context.Context, opts session.Options, popts PushOptions) ([]PushResult, error) {
	registry, _, err := buildkit.RegistryHost(popts.Registry)
	if err != nil {
		return nil, err
	}
	if hosts := spread.Daemons(opts); len(hosts) > 1 {
		return pushSpread(ctx, opts, popts, registry, hosts)
	}
	s, err := session.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return PushImages(ctx, s, registry, popts.SkipTLSVerify, Tags(s.Plan.Stamp.Version, popts.Latest), popts.ReadBack)
}

// Tags are the tags a push gives each image.
func Tags(version string, latest bool) []string {
	if latest {
		return []string{version, "latest"}
	}
	return []string{version}
}

// PushImages builds every image of the session and pushes it under tags, or, with
// no tags, by digest alone (a part of a spread push).
func PushImages(ctx context.Context, s *session.Session, registry string, skipTLSVerify bool, tags []string, readBack bool) ([]PushResult, error) {
	s.UseRegistry(registry + "/" + s.Plan.Repository)
	var jobs []buildkit.Job
	var results []PushResult
	for _, img := range s.Plan.Images {
		var refs []string
		for _, tag := range tags {
			ref := fmt.Sprintf("%s/%s/%s:%s", registry, s.Plan.Repository, img.Name, tag)
			if _, err := reference.ParseNormalizedNamed(ref); err != nil {
				return nil, fmt.Errorf("image reference %q: %w", ref, err)
			}
			refs = append(refs, ref)
		}
		name := strings.Join(refs, ",")
		if len(tags) == 0 {
			name = fmt.Sprintf("%s/%s/%s", registry, s.Plan.Repository, img.Name)
			if _, err := reference.ParseNormalizedNamed(name); err != nil {
				return nil, fmt.Errorf("image reference %q: %w", name, err)
			}
		}
		exportAttrs := s.ExporterAttrs(name, img.HasBase())
		exportAttrs["push"] = "true"
		if len(tags) == 0 {
			exportAttrs["push-by-digest"] = "true"
		}
		if skipTLSVerify {
			exportAttrs["registry.insecure"] = "true"
		}
		frontendAttrs := map[string]string{"platform": strings.Join(img.PlatformIDs(), ",")}
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.Build(img),
			FrontendAttrs: frontendAttrs,
			Export:        client.ExportEntry{Type: client.ExporterImage, Attrs: exportAttrs},
		})
		results = append(results, PushResult{Name: img.Name, Refs: refs})
	}
	out, err := s.SolveImages(ctx, jobs)
	if err != nil {
		return nil, explainPush(err, registry)
	}
	_, loopback, _ := buildkit.RegistryHost(registry)
	resolver := buildkit.Resolver(loopback, skipTLSVerify, buildkit.Credentials())
	for i := range results {
		results[i].Digest = out.Results[i].Digest
		if !readBack {
			continue
		}
		repo := registry + "/" + s.Plan.Repository + "/" + results[i].Name
		_, manifests, err := PlatformManifests(ctx, resolver, repo, digest.Digest(results[i].Digest))
		if err != nil {
			return nil, err
		}
		for _, m := range manifests {
			results[i].Platforms = append(results[i].Platforms, inspect.PlatformDigest{Platform: config.FormatPlatform(*m.Platform), Digest: m.Digest.String()})
		}
	}
	return results, nil
}

// status401 is an HTTP 401, not a port or digest that contains 401.
var status401 = regexp.MustCompile(`(^|[^0-9:.a-f])401([^0-9a-f]|$)`)

// explainPush adds the remedy to the registry errors people meet most.
func explainPush(err error, registry string) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host") || strings.Contains(msg, "i/o timeout"):
		return fmt.Errorf("push to %s: the registry is unreachable; start it or fix -registry/%s, then run the push again: %w", registry, RegistryEnv, err)
	case status401.MatchString(msg) || strings.Contains(strings.ToLower(msg), "unauthorized") || strings.Contains(msg, "authentication required"):
		return fmt.Errorf("push to %s: the registry refused the credentials (401); kiln reads them from %s (DOCKER_CONFIG); log in with `docker login %s` or fix that file: %w", registry, buildkit.DockerConfigPath(), registry, err)
	}
	return fmt.Errorf("push to %s: %w", registry, err)
}

// PlatformManifests are the platform manifests of a pushed index.
func PlatformManifests(ctx context.Context, resolver remotes.Resolver, repo string, index digest.Digest) (ocispec.Descriptor, []ocispec.Descriptor, error) {
	ref := repo + "@" + index.String()
	_, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return desc, nil, fmt.Errorf("read back %s: %w", ref, err)
	}
	f, err := resolver.Fetcher(ctx, ref)
	if err != nil {
		return desc, nil, err
	}
	data, err := buildkit.ReadBlob(ctx, f, desc, 4<<20)
	if err != nil {
		return desc, nil, fmt.Errorf("read back %s: %w", ref, err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return desc, nil, fmt.Errorf("read back %s: not an index: %w", ref, err)
	}
	var out []ocispec.Descriptor
	for _, m := range idx.Manifests {
		if m.Platform != nil && m.Platform.OS != "unknown" {
			out = append(out, m)
		}
	}
	return desc, out, nil
}
