package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/image"
)

// Isolated is a session on the same daemon that re-runs every step, once
// for all its images, on an empty Go build cache of its own (isolate);
// cleanup empties that cache. verify:repro's second build is one.
func (s *Session) Isolated(ctx context.Context) (*Session, func(), error) {
	iso := &Session{Graph: s.Graph, daemon: s.daemon, locals: s.locals, mode: s.mode, out: s.out, attach: s.attach, clock: s.clock, vendor: s.vendor}
	if err := iso.isolate(ctx); err != nil {
		return nil, nil, err
	}
	return iso, func() {
		for _, f := range iso.cleanups {
			f()
		}
	}, nil
}

// isolate makes every step of s re-run whatever the daemon's local cache
// holds under its key (a result imported from a layer cache by an earlier
// build, or written by another client), once for all its images, on an
// empty Go build cache whose id is golang.IsolatedCachePrefix and a random
// suffix: two sessions on one daemon (a team's remote daemon) share no Go
// cache, and neither empties the other's. The module cache mount stays
// shared: what the module layer copies from it is checked against go.sum.
// Close empties the Go cache; buildkit:prune removes what an interrupted
// session left.
func (s *Session) isolate(ctx context.Context) error {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	id := golang.IsolatedCachePrefix + hex.EncodeToString(suffix)
	plan := *s.Plan
	plan.Cache.GoCache = id
	g := image.NewGraphFrom(&plan, s.Golang.Context, s.Golang.Toolchain, s.Golang.Excludes, s.Golang.Fetch)
	if s.vendor != nil {
		// The same files as the plan's: an error there is one here.
		if _, err := g.Golang.UseVendorArchive(); err != nil {
			return err
		}
	}
	g.NoCache, g.Golang.TraceCompiles = true, s.Golang.TraceCompiles
	s.Graph = g
	s.cleanups = append(s.cleanups, func() { s.pruneIsolatedCache(context.WithoutCancel(ctx), id) })
	return nil
}

// pruneIsolatedCache empties the isolated cache id; a failure leaves it to
// the next buildkit:prune or the daemon's garbage collection.
func (s *Session) pruneIsolatedCache(ctx context.Context, id string) {
	filter := client.WithFilter([]string{"type==" + string(client.UsageRecordTypeCacheMount) + ",description~=" + id})
	if err := s.daemon.Prune(ctx, nil, filter, client.PruneAll); err != nil {
		log.G(ctx).Warnf("could not empty the isolated Go cache %s on %s: %v", id, s.daemon.Address, err)
	}
}
