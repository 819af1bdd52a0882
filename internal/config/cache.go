package config

import (
	"fmt"
	"strings"
)

// CacheSpec is a BuildKit cache import or export: its type and attributes.
type CacheSpec struct {
	Type  string
	Attrs map[string]string
}

// ParseCache parses "type=registry,ref=host/repo/cache,mode=max", the
// syntax of buildctl's --export-cache and --import-cache.
func ParseCache(s string) (CacheSpec, error) {
	spec := CacheSpec{Attrs: map[string]string{}}
	for _, field := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(field), "=")
		if !ok || k == "" {
			return spec, fmt.Errorf("%q is not key=value in %q (e.g. type=registry,ref=host/repo/cache,mode=max)", field, s)
		}
		if k == "type" {
			spec.Type = v
		} else {
			spec.Attrs[k] = v
		}
	}
	switch spec.Type {
	case "registry", "local", "inline", "gha", "s3", "azblob":
	case "":
		return spec, fmt.Errorf("%q has no type= (e.g. type=registry)", s)
	default:
		return spec, fmt.Errorf("cache type %q is unknown (registry, local, inline, gha, s3, azblob)", spec.Type)
	}
	if spec.Type == "registry" && spec.Attrs["ref"] == "" {
		return spec, fmt.Errorf("%q: a registry cache needs ref=", s)
	}
	return spec, nil
}
