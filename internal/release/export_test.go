package release

// WarmRebuilds makes release:verify rebuild on the daemon's caches until
// restore is called: the same images, without the cold compile of an
// isolated rebuild.
func WarmRebuilds() (restore func()) {
	trustCachesInRebuild = true
	return func() { trustCachesInRebuild = false }
}
