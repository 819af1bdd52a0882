package plan

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/config"
)

func TestGoEnvIsTheOneEnvironmentOfEveryCompile(t *testing.T) {
	stamp := Stamp{LDFlags: []string{"-X m/version.Version=v1"}}
	for _, tc := range []struct {
		name     string
		goCfg    config.GoEnv
		modMode  string
		wantEnv  []string
		wantArgs []string
	}{
		{"defaults", config.GoEnv{}, ModReadonly,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOSUMDB=off"},
			[]string{"-trimpath", "-buildvcs=false", "-ldflags=-X m/version.Version=v1"}},
		{"vendor mode, tags, gcflags and ldflags", config.GoEnv{Tags: []string{"a", "b"}, GCFlags: "-N", LDFlags: "-s -w"}, ModVendor,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=vendor", "GOPROXY=off", "GOSUMDB=off"},
			[]string{"-trimpath", "-buildvcs=false", "-tags=a,b", NoDWARF, "-gcflags=-N", "-ldflags=-s -w -X m/version.Version=v1"}},
		{"a link that keeps DWARF compiles it", config.GoEnv{LDFlags: "-s -w=0"}, ModReadonly,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOSUMDB=off"},
			[]string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w=0 -X m/version.Version=v1"}},
		{"-s alone drops DWARF too", config.GoEnv{LDFlags: "-s"}, ModReadonly,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOSUMDB=off"},
			[]string{"-trimpath", "-buildvcs=false", NoDWARF, "-ldflags=-s -X m/version.Version=v1"}},
		{"a -gcflags in GOFLAGS is not replaced", config.GoEnv{LDFlags: "-s -w", Env: map[string]string{"GOFLAGS": "-gcflags=all=-B"}}, ModReadonly,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-gcflags=all=-B -mod=readonly", "GOPROXY=off", "GOSUMDB=off"},
			[]string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w -X m/version.Version=v1"}},
		{"configured GOFLAGS keep all but -mod; env sorted", config.GoEnv{Env: map[string]string{"GOFLAGS": "-mod=mod -p=2", "GOAMD64": "v3", "GOEXPERIMENT": "x"}}, ModReadonly,
			[]string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-p=2 -mod=readonly", "GOPROXY=off", "GOSUMDB=off", "GOAMD64=v3", "GOEXPERIMENT=x"},
			[]string{"-trimpath", "-buildvcs=false", "-ldflags=-X m/version.Version=v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := goEnv(&config.Config{Go: tc.goCfg}, stamp, tc.modMode)
			if !slices.Equal(got.Env, tc.wantEnv) {
				t.Errorf("env\n got %q\nwant %q", got.Env, tc.wantEnv)
			}
			if !slices.Equal(got.BuildArgs, tc.wantArgs) {
				t.Errorf("args\n got %q\nwant %q", got.BuildArgs, tc.wantArgs)
			}
		})
	}
}

func TestTargetEnvIsAllThatDiffersBetweenCompiles(t *testing.T) {
	for _, tc := range []struct {
		target ocispec.Platform
		want   []string
	}{
		{ocispec.Platform{OS: "linux", Architecture: "amd64"}, []string{"GOOS=linux", "GOARCH=amd64"}},
		{ocispec.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, []string{"GOOS=linux", "GOARCH=arm64"}},
		{ocispec.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}, []string{"GOOS=linux", "GOARCH=arm", "GOARM=7"}},
		{ocispec.Platform{OS: "windows", Architecture: "amd64"}, []string{"GOOS=windows", "GOARCH=amd64"}},
	} {
		if got := TargetEnv(tc.target); !slices.Equal(got, tc.want) {
			t.Errorf("TargetEnv(%v) = %q, want %q", tc.target, got, tc.want)
		}
	}
}

func TestModuleEnvIsAskedAgainWhenTheEnvironmentChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go env")
	}
	cache, dir := t.TempDir(), t.TempDir()
	for _, proxy := range []string{"https://one.invalid", "https://two.invalid", "https://one.invalid"} {
		t.Setenv("GOPROXY", proxy)
		out, err := ModuleEnv(cache, dir, "GOPROXY")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, proxy) {
			t.Errorf("GOPROXY=%s: go env answered %s", proxy, out)
		}
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 2 {
		t.Errorf("%d answers kept, want one per environment", len(entries))
	}

	t.Setenv("GOPROXY", "https://user:secret@proxy.invalid")
	if out, err := ModuleEnv(cache, dir, "GOPROXY"); err != nil || !strings.Contains(out, "secret@") {
		t.Fatalf("go env with credentials: %q, %v", out, err)
	}
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if data, _ := os.ReadFile(filepath.Join(cache, e.Name())); strings.Contains(string(data), "secret") {
			t.Errorf("%s keeps the proxy's password", e.Name())
		}
	}
}
