// Package publish owns the last stage of the flow: it takes a build session
// and delivers its images to a registry (push), into containerd (load, then
// smoke runs), or as a release (stamped assets with a signed SHA256SUMS,
// images signed with a signed SLSA provenance and SPDX SBOMs attached, see
// package sign), and proves a published release against its source
// (release:verify).
package publish
