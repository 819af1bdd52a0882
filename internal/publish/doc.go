// Package publish owns the last stage of the flow: it takes a build session
// and delivers its images to a registry (push), into containerd (load, then
// smoke runs), or as a release (stamped assets with SHA256SUMS and images
// with provenance and SBOM attestations).
package publish
