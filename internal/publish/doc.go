// Package publish owns the last stage of the flow: it takes a build session
// and delivers its images to a registry (push, and images:resolve, which
// pins YAML manifests to what it pushed), into containerd (load, then smoke
// runs), or as a release (images signed with a signed SLSA provenance and
// SPDX SBOMs attached, see package sign; stamped binaries and pinned
// manifests as assets with a signed SHA256SUMS), and proves a published
// release against its source (release:verify).
package publish
