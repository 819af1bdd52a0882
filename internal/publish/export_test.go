package publish

import (
	"context"

	"github.com/kiln-build/kiln/internal/build"
)

// WarmRebuilds makes release:verify rebuild with build.Images, on the
// daemon's caches, until restore is called: the same images, without the
// cold compile of an isolated rebuild.
func WarmRebuilds() (restore func()) {
	rebuild = func(ctx context.Context, opts build.Options) (*build.ImagesOutcome, error) {
		opts.SkipChecks = true
		return build.Images(ctx, opts)
	}
	return func() { rebuild = build.Rebuild }
}
