package config

import (
	"strings"
	"testing"
)

func TestDriftFindsEveryKind(t *testing.T) {
	override := func(yaml string) string {
		return strings.Replace(goodKiln, "package: ./cmd/antrea-agent", "package: ./cmd/antrea-agent\n    go:\n"+yaml, 1)
	}
	tests := []struct {
		name, kiln, kind, field string
	}{
		{"cgo on for one binary", override("      env:\n        CGO_ENABLED: \"1\""), "cgo", "binaries[1].go.env.CGO_ENABLED"},
		{"other tags", override("      tags: [netgo]"), "tags", "binaries[1].go.tags"},
		{"other gcflags", override("      gcflags: \"-N -l\""), "gcflags", "binaries[1].go.gcflags"},
		{"trimpath off", override("      flags: [-trimpath=false]"), "trimpath", "binaries[1].go.flags"},
		{"other flags", override("      flags: [-race]"), "flags", "binaries[1].go.flags"},
		{"other GOFLAGS", override("      env:\n        GOFLAGS: -mod=vendor"), "goflags", "binaries[1].go.env.GOFLAGS"},
		{"other GOAMD64", override("      env:\n        GOAMD64: v3"), "goenv", "binaries[1].go.env.GOAMD64"},
		{"timestamp in ldflags", strings.Replace(goodKiln, `ldflags: "-s -w"`, `ldflags: "-s -w -X main.buildDate=2026-11-29T10:00:00Z"`, 1), "volatile-ldflags", "go.ldflags"},
		{"shell substitution in ldflags", strings.Replace(goodKiln, `ldflags: "-s -w"`, `ldflags: "-s -w -X main.commit=$(git rev-parse HEAD)"`, 1), "volatile-ldflags", "go.ldflags"},
		{"commit id in ldflags", override("      ldflags: \"-X main.commit=91db7230b45f4ec4eaaf7edfab09f8946bc554b7\""), "volatile-ldflags", "binaries[1].go.ldflags"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(repo(t, map[string]string{File: tt.kiln}))
			if err != nil {
				t.Fatal(err)
			}
			findings := c.Drift()
			if len(findings) != 1 {
				t.Fatalf("%d findings, want 1: %+v", len(findings), findings)
			}
			f := findings[0]
			if f.Kind != tt.kind || f.Field != tt.field {
				t.Errorf("finding %s at %s, want %s at %s", f.Kind, f.Field, tt.kind, tt.field)
			}
			if f.Problem == "" || f.Cost == "" || f.Fix == "" {
				t.Errorf("finding lacks problem, cost or fix: %+v", f)
			}
		})
	}
}

func TestNoDriftInUniformConfigs(t *testing.T) {
	same := strings.Replace(goodKiln, "package: ./cmd/antrea-agent", "package: ./cmd/antrea-agent\n    go:\n      ldflags: \"-s -w -X main.edition=oss\"", 1)
	for name, kiln := range map[string]string{"default": goodKiln, "stable -X": same} {
		c, err := Load(repo(t, map[string]string{File: kiln}))
		if err != nil {
			t.Fatal(err)
		}
		if f := c.Drift(); len(f) != 0 {
			t.Errorf("%s: unexpected findings %+v", name, f)
		}
	}
	c, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Drift(); len(f) != 0 {
		t.Errorf("the repository's own configuration drifts: %+v", f)
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{"4MiB": 4 << 20, "3.5MB": 3500000, "4000000": 4000000, "12 KiB": 12 << 10, "1GiB": 1 << 30, "100B": 100}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "4 MiBs", "-1MB", "0", "1TB", "MiB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}
