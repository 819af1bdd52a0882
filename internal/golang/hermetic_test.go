package golang_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestCompileStepsCannotReachTheNetwork runs, as a compile step, a go
// command that needs the network (a module download from the caller's
// proxy): it must fail, naming the step. The repository is a tiny one
// with no modules, so no download step runs before it.
func TestCompileStepsCannotReachTheNetwork(t *testing.T) {
	d := testdaemon.Buildkit(t)
	ctx := context.Background()
	root := testdaemon.TinyRepo(t, "[linux/amd64]")
	p, err := session.Plan(session.Options{Root: root, Platforms: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := buildkit.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	tc, err := golang.ToolchainArchive(ctx, p.Toolchain, cache, strings.TrimSpace(string(proxy)))
	if err != nil {
		t.Fatal(err)
	}
	g := golang.NewGraph(p, golang.Context(root, nil), golang.Toolchain(p.Toolchain), nil, nil)
	const name = "[network probe linux/amd64] go mod download"
	st := g.GoCommand([]string{"/usr/local/go/bin/go", "mod", "download", "-x", "golang.org/x/text@v0.3.8"},
		g.Sources(p.Binaries[0]), p.Platforms[0], name,
		llb.AddEnv("GOPROXY", strings.TrimSpace(string(proxy))), llb.AddEnv("GOFLAGS", "-modcacherw"), llb.AddEnv("GOMODCACHE", "/tmp/mod")).Root()
	job := buildkit.Job{
		Name: "network probe",
		Build: func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
			def, err := st.Marshal(ctx)
			if err != nil {
				return nil, err
			}
			return c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB()})
		},
		Export: client.ExportEntry{Type: client.ExporterLocal},
		Dest:   t.TempDir() + "/out",
	}
	_, err = d.Solve(ctx, []buildkit.Job{job}, buildkit.SolveOptions{Locals: map[string]string{golang.LocalContext: root, golang.LocalToolchain: tc, golang.LocalCACerts: "/etc/ssl/certs"}, Mounts: g.SourceMounts(), Progress: "quiet"})
	if err == nil {
		t.Fatal("a compile step downloaded a module: it has network")
	}
	msg := err.Error()
	if !strings.Contains(msg, name) {
		t.Errorf("error does not name the step: %s", msg)
	}
	if !strings.Contains(msg, "dial tcp") && !strings.Contains(msg, "lookup") {
		t.Errorf("error does not show the refused connection: %s", msg)
	}
}
