package publish

import (
	"context"

	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/verify"
)

// WarmRebuilds makes release:verify rebuild with session.Images, on the
// daemon's caches, until restore is called: the same images, without the
// cold compile of an isolated rebuild.
func WarmRebuilds() (restore func()) {
	rebuild = func(ctx context.Context, opts session.Options) (*session.ImagesOutcome, error) {
		opts.SkipChecks = true
		return session.Images(ctx, opts)
	}
	return func() { rebuild = verify.Rebuild }
}
