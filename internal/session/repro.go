package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/verify"
)

// ReproOutcome is the result of building one commit twice.
type ReproOutcome struct {
	First, Second []ImageResult
	Differences   []verify.Difference
}

// Repro builds every image twice, the second time in isolation (every step
// re-run, an empty Go build cache), and compares the two down to files and
// ELF sections. Nothing is left under _output (the session reads the file
// system's clock there with a file it removes at once).
func Repro(ctx context.Context, opts Options) (*ReproOutcome, error) {
	s, err := Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	tmp, err := os.MkdirTemp("", "kiln-repro-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	first := opts
	first.OutDir, first.SkipChecks = filepath.Join(tmp, "first"), true
	a, err := s.images(ctx, first)
	if err != nil {
		return nil, fmt.Errorf("first build: %w", err)
	}

	second, cleanup, err := s.isolated(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	opts2 := opts
	opts2.OutDir, opts2.SkipChecks = filepath.Join(tmp, "second"), true
	b, err := second.images(ctx, opts2)
	if err != nil {
		return nil, fmt.Errorf("second, isolated build: %w", err)
	}

	out := &ReproOutcome{First: a.Images, Second: b.Images}
	for i := range a.Images {
		if a.Images[i].Digest == b.Images[i].Digest {
			continue
		}
		la, err := verify.ReadLayout(a.Images[i].Path)
		if err != nil {
			return nil, err
		}
		lb, err := verify.ReadLayout(b.Images[i].Path)
		if err != nil {
			return nil, err
		}
		out.Differences = append(out.Differences, verify.DiffLayouts(a.Images[i].Name, la, lb)...)
	}
	return out, nil
}

// isolated is a session on the same daemon that re-runs every step, once
// for all its images, on an empty Go build cache of its own: its id is
// golang.IsolatedCachePrefix and a random suffix, so two sessions on one
// daemon (a team's remote daemon) share no Go cache, and neither empties the
// other's. cleanup empties it; buildkit:prune removes what an interrupted
// session left.
func (s *Session) isolated(ctx context.Context) (*Session, func(), error) {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return nil, nil, err
	}
	id := golang.IsolatedCachePrefix + hex.EncodeToString(suffix)
	plan := *s.Plan
	plan.Cache.GoCache = id
	iso := &Session{Graph: image.NewGraphFrom(&plan, s.Golang.Context, s.Golang.Toolchain, s.Golang.Excludes, s.Golang.Fetch), daemon: s.daemon, locals: s.locals, mode: s.mode, out: s.out, attach: s.attach, clock: s.clock}
	if s.vendor != nil {
		// The same files as the first build's: an error there is one here.
		if _, err := iso.Golang.UseVendorArchive(); err != nil {
			return nil, nil, err
		}
		iso.vendor = s.vendor
	}
	iso.NoCache = true
	return iso, func() { s.pruneReproCache(context.WithoutCancel(ctx), id) }, nil
}

// pruneReproCache empties the isolated cache id; a failure leaves it to
// the next buildkit:prune or the daemon's garbage collection.
func (s *Session) pruneReproCache(ctx context.Context, id string) {
	filter := client.WithFilter([]string{"type==" + string(client.UsageRecordTypeCacheMount) + ",description~=" + id})
	if err := s.daemon.Prune(ctx, nil, filter, client.PruneAll); err != nil {
		log.G(ctx).Warnf("could not empty the isolated Go cache %s on %s: %v", id, s.daemon.Address, err)
	}
}

// Rebuild builds every image once in isolation, as Repro's second build
// does (every step re-run, an empty Go build cache of its own), and writes
// the OCI tarballs under opts.OutDir. release:verify compares them with a
// registry.
func Rebuild(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	s, err := Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	rebuild, cleanup, err := s.isolated(ctx)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	opts.SkipChecks = true
	return rebuild.images(ctx, opts)
}
