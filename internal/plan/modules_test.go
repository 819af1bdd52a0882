package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/config"
)

func TestModMode(t *testing.T) {
	plain, vendored := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(vendored, "vendor"), 0o755)
	os.WriteFile(filepath.Join(vendored, "vendor", "modules.txt"), nil, 0o644)
	cfgFlags := func(flags string) *config.Config {
		return &config.Config{Go: config.GoEnv{Env: map[string]string{"GOFLAGS": flags}}}
	}
	for _, tc := range []struct {
		name, env, root string
		cfg             *config.Config
		workspace       bool
		want, err       string
	}{
		{name: "default", root: plain, cfg: &config.Config{}, want: ModReadonly},
		{name: "vendor directory", root: vendored, cfg: &config.Config{}, want: ModVendor},
		{name: "caller's -mod=mod", env: "-trimpath -mod=mod", root: vendored, cfg: &config.Config{}, want: ModMod},
		{name: "caller's -mod=readonly over vendor", env: "-mod=readonly", root: vendored, cfg: &config.Config{}, want: ModReadonly},
		{name: "kiln.yaml -mod=mod", root: plain, cfg: cfgFlags("-mod=mod"), want: ModMod},
		{name: "caller wins over kiln.yaml", env: "--mod=readonly", root: plain, cfg: cfgFlags("-mod=mod"), want: ModReadonly},
		{name: "-mod=vendor without vendor/", env: "-mod=vendor", root: plain, cfg: &config.Config{}, err: "run `go mod vendor`"},
		{name: "unknown mode", env: "-mod=fancy", root: plain, cfg: &config.Config{}, err: "go knows -mod=vendor, -mod=readonly and -mod=mod only"},
		{name: "-mod=mod in a workspace", env: "-mod=mod", root: plain, cfg: &config.Config{}, workspace: true, err: "refuses in workspace mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from, err := modMode(tc.root, tc.cfg, tc.workspace, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || from == "" {
				t.Fatalf("mode %q (%q), error %v; want %q", got, from, err, tc.want)
			}
		})
	}
}

func TestHint(t *testing.T) {
	for _, tc := range []struct{ output, want string }{
		{"go: example.com/x@v1.0.0: reading https://proxy.example/example.com/x/@v/v1.0.0.info: 404 Not Found", "module example.com/x@v1.0.0: the proxy https://proxy.example refused it (404 Not Found)"},
		{"go: example.com/x@v1.0.0: reading https://user:secret@proxy.example/mirror/example.com/x/@v/v1.0.0.zip: 403 Forbidden", "the proxy https://proxy.example/mirror refused it (403 Forbidden)"},
		{"verifying example.com/x@v1.0.0/go.mod: checksum mismatch", "module example.com/x@v1.0.0: its content does not match go.sum"},
		{"go: inconsistent vendoring in /src:", "run `go mod vendor`"},
		{"missing go.sum entry for module providing package example.com/x/y (imported by z)", "go.sum lacks the lines for example.com/x/y"},
		{"some other failure", ""},
	} {
		got := Hint(tc.output)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("Hint(%q) = %q, want it to contain %q", tc.output, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("Hint printed a proxy credential: %q", got)
		}
	}
}
