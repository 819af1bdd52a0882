// Package release owns the release: every image pushed (over several
// daemons too) and signed with a signed SLSA provenance and SPDX SBOMs
// attached (package sign), stamped binaries and pinned manifests as
// assets with a signed SHA256SUMS; and release:verify, which proves a
// published release against its source.
package release
