// Package publish owns delivering a build session's images: to a registry
// (push, over several daemons too, and images:resolve, which pins YAML
// manifests to what it pushed) and into containerd (load, then smoke
// runs). Package release builds on it.
package publish
