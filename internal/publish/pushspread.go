package publish

import (
	"context"
	"fmt"
	"slices"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/ocimerge"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/spread"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// pushSpread pushes the images with their platforms spread over several
// daemons (spread.Split): each daemon pushes its platforms by digest, with
// no tag, and kiln then pushes and tags the indexes (PushIndexes) once
// every daemon has pushed and every part read the same tree.
func pushSpread(ctx context.Context, opts session.Options, popts PushOptions, registry string, hosts []string) ([]PushResult, error) {
	p, err := session.Plan(opts)
	if err != nil {
		return nil, err
	}
	shares, err := spread.Split(opts, p, hosts)
	if err != nil {
		return nil, err
	}
	pushed := make([][]PushResult, len(shares))
	reads := make([]spread.Read, len(shares))
	err = spread.Run(ctx, shares, hosts, popts.RetryElsewhere, func(ctx context.Context, i int, sh spread.Share) error {
		s, err := session.Start(ctx, sh.Options)
		if err != nil {
			return err
		}
		defer s.Close()
		before := s.SourceDigests()
		if pushed[i], err = PushImages(ctx, s, registry, popts.SkipTLSVerify, nil, false); err != nil {
			return err
		}
		reads[i], err = spread.ReadBy(sh, s, before)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := spread.SameTree(reads); err != nil {
		return nil, err
	}

	parts := make([]PushResult, 0, len(p.Images))
	for _, part := range pushed {
		parts = append(parts, part...)
	}
	return PushIndexes(ctx, p, parts, reads[0].Stamp.Version, popts, registry)
}

// PushIndexes makes each image's index of the platform manifests the parts
// pushed by digest (each part an index of some of its platforms), in the
// image's platform order, as the bytes one daemon's push gives it
// (ocimerge.Index), and pushes it by digest; once every index is in the
// registry it tags them with the version (and latest when asked), so a
// failure moves no tag. PushOptions.ReadBack lists each result's
// platform manifests.
func PushIndexes(ctx context.Context, p *plan.Plan, parts []PushResult, version string, popts PushOptions, registry string) ([]PushResult, error) {
	_, loopback, _ := buildkit.RegistryHost(registry)
	// Each push its own resolver: one resolver's push tracker would take
	// the second tag of an index for done.
	pusher := func(ref string) (remotes.Pusher, error) {
		return buildkit.Resolver(loopback, popts.SkipTLSVerify, buildkit.Credentials()).Pusher(ctx, ref)
	}
	// Every index is made and pushed by digest before any tag moves, so a
	// failure leaves the tags where they were.
	var results []PushResult
	indexes := make([][]byte, len(p.Images))
	for i, img := range p.Images {
		repo := registry + "/" + p.Repository + "/" + img.Name
		var manifests []ocispec.Descriptor
		for _, r := range parts {
			if r.Name != img.Name {
				continue
			}
			_, m, err := PlatformManifests(ctx, buildkit.Resolver(loopback, popts.SkipTLSVerify, buildkit.Credentials()), repo, digest.Digest(r.Digest))
			if err != nil {
				return nil, spreadPushErr(err, registry)
			}
			manifests = append(manifests, m...)
		}
		index, err := inOrder(manifests, img.PlatformIDs())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", repo, err)
		}
		if indexes[i], err = ocimerge.Index(index); err != nil {
			return nil, err
		}
		ref := repo + "@" + digest.FromBytes(indexes[i]).String()
		w, err := pusher(ref)
		if err == nil {
			err = buildkit.WriteBlob(ctx, w, indexDesc(indexes[i]), indexes[i])
		}
		if err != nil {
			return nil, spreadPushErr(fmt.Errorf("push %s: %w", ref, err), registry)
		}
		result := PushResult{Name: img.Name, Digest: indexDesc(indexes[i]).Digest.String()}
		if popts.ReadBack {
			for _, m := range index {
				result.Platforms = append(result.Platforms, inspect.PlatformDigest{Platform: platforms.Format(*m.Platform), Digest: m.Digest.String()})
			}
		}
		results = append(results, result)
	}
	for i, img := range p.Images {
		for _, tag := range Tags(version, popts.Latest) {
			ref := registry + "/" + p.Repository + "/" + img.Name + ":" + tag
			w, err := pusher(ref)
			if err == nil {
				err = buildkit.WriteBlob(ctx, w, indexDesc(indexes[i]), indexes[i])
			}
			if err != nil {
				return nil, spreadPushErr(fmt.Errorf("tag %s: %w", ref, err), registry)
			}
			results[i].Refs = append(results[i].Refs, ref)
		}
	}
	return results, nil
}

func indexDesc(data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

// spreadPushErr says that kiln's own client reads and tags a spread push,
// where a one-daemon push needs only the daemon to reach the registry.
func spreadPushErr(err error, registry string) error {
	return fmt.Errorf("%w (a push spread over several daemons reads and tags the images with kiln's own client, which reaches %s over HTTPS trusting the system's CAs, or plain HTTP on loopback; -skiptlsverify skips the certificate check)", explainPush(err, registry), registry)
}

// inOrder is one manifest for each platform, in the image's order.
func inOrder(manifests []ocispec.Descriptor, platformIDs []string) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	for _, id := range platformIDs {
		i := slices.IndexFunc(manifests, func(m ocispec.Descriptor) bool { return platforms.Format(*m.Platform) == id })
		if i < 0 {
			return nil, fmt.Errorf("no daemon pushed %s", id)
		}
		out = append(out, manifests[i])
	}
	if len(out) != len(manifests) {
		return nil, fmt.Errorf("the daemons pushed %d platform manifests for %d platforms", len(manifests), len(platformIDs))
	}
	return out, nil
}
