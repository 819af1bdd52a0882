package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// supported lists the platforms kiln cross-compiles to, as containerd
// normalises them. Images are linux only; raw binaries may use the others.
var supported = []string{
	"linux/amd64", "linux/arm64", "linux/arm/v7", "linux/arm/v6", "linux/386",
	"linux/ppc64le", "linux/s390x", "linux/riscv64",
	"darwin/amd64", "darwin/arm64", "windows/amd64", "windows/arm64",
}

// ParsePlatform parses and normalises a platform string such as
// "linux/arm64" or "linux/arm/v7", refusing the ones kiln cannot build.
func ParsePlatform(s string) (ocispec.Platform, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return ocispec.Platform{}, fmt.Errorf("empty platform (want os/arch[/variant], e.g. linux/arm64)")
	}
	p, err := platforms.Parse(s)
	if err != nil || !strings.Contains(s, "/") {
		return ocispec.Platform{}, fmt.Errorf("invalid platform %q (want os/arch[/variant], e.g. linux/arm64)", s)
	}
	p = platforms.Normalize(p)
	if p.Architecture == "arm" && p.Variant == "" {
		p.Variant = "v7"
	}
	if p.Architecture == "arm64" {
		// v8 is what every arm64 image means; Go has no other arm64 target.
		if p.Variant != "" && p.Variant != "v8" {
			return ocispec.Platform{}, fmt.Errorf("unsupported platform %q: Go builds arm64 for v8 only (write linux/arm64)", s)
		}
		p.Variant = ""
	}
	if !slices.Contains(supported, FormatPlatform(p)) {
		return ocispec.Platform{}, fmt.Errorf("unsupported platform %q (supported: %s)", s, strings.Join(supported, ", "))
	}
	return p, nil
}

// ParsePlatforms parses a comma-separated list, refusing duplicates.
func ParsePlatforms(list string) ([]ocispec.Platform, error) {
	var out []ocispec.Platform
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		p, err := ParsePlatform(s)
		if err != nil {
			return nil, err
		}
		id := FormatPlatform(p)
		if seen[id] {
			return nil, fmt.Errorf("platform %q listed twice", id)
		}
		seen[id] = true
		out = append(out, p)
	}
	return out, nil
}

// FormatPlatform renders a platform as os/arch[/variant].
func FormatPlatform(p ocispec.Platform) string {
	return platforms.Format(p)
}

// GOARM returns the GOARM value of a 32-bit arm platform, "" for others.
func GOARM(p ocispec.Platform) string {
	if p.Architecture != "arm" {
		return ""
	}
	return strings.TrimPrefix(p.Variant, "v")
}
