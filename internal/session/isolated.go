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
// for all its images, on an empty Go build cache of its own: its id is
// golang.IsolatedCachePrefix and a random suffix, so two sessions on one
// daemon (a team's remote daemon) share no Go cache, and neither empties the
// other's. cleanup empties it; buildkit:prune removes what an interrupted
// session left.
func (s *Session) Isolated(ctx context.Context) (*Session, func(), error) {
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
