package session

import (
	"bytes"
	"context"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/solver/pb"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

var amd64 = ocispec.Platform{OS: "linux", Architecture: "amd64"}

var greetV1 = modfixture.Module{Path: "example.com/greet", Version: "v1.0.0", Files: map[string]string{
	"go.mod":   "module example.com/greet\n\ngo 1.26\n",
	"greet.go": "package greet\n\nfunc Hello() string { return \"hello from greet v1.0.0\" }\n",
}}

// mainUsing is a main package printing the Hello of the given import path.
func mainUsing(importPath string) string {
	return "package main\n\nimport (\n\t\"os\"\n\n\tgreet \"" + importPath + "\"\n)\n\nfunc main() { os.Stdout.WriteString(greet.Hello() + \"\\n\") }\n"
}

const plainMain = "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"plain\\n\") }\n"

// greetApp is a module whose cmd/hello uses example.com/greet, served by a
// new proxy directory, with the test's Go environment isolated.
func greetApp(t *testing.T, extra map[string]string) (app, proxy string) {
	t.Helper()
	isolateGo(t)
	proxy = tempDir(t)
	sums := modfixture.Proxy(t, proxy, greetV1)
	app = t.TempDir()
	files := map[string]string{
		"go.mod":            "module example.com/app\n\ngo 1.26\n\nrequire example.com/greet v1.0.0\n",
		"go.sum":            sums,
		"cmd/hello/main.go": mainUsing("example.com/greet"),
	}
	maps.Copy(files, extra)
	modfixture.Write(t, app, files)
	return app, proxy
}

// isolateGo gives the host go of the plan stage its own module cache and
// no sum database, so a test sees only its own proxies.
func isolateGo(t *testing.T) {
	t.Setenv("GOMODCACHE", t.TempDir())
	t.Setenv("GOFLAGS", "-modcacherw")
	t.Setenv("GOSUMDB", "off")
	t.Setenv("GOPRIVATE", "")
	t.Setenv("GONOPROXY", "")
	t.Setenv("GONOSUMDB", "")
	t.Setenv("GOWORK", "")
	t.Setenv("GOTOOLCHAIN", "local")
}

type moduleBuild struct {
	out      *BinariesOutcome
	progress string
	dir      string
}

func buildModule(t *testing.T, dir string, pkgs ...string) (*moduleBuild, error) {
	t.Helper()
	return buildModuleInto(t, t.TempDir(), dir, pkgs...)
}

// buildModuleInto builds into out, where an earlier build may have written.
func buildModuleInto(t *testing.T, out, dir string, pkgs ...string) (*moduleBuild, error) {
	t.Helper()
	var progress bytes.Buffer
	res, err := Binaries(context.Background(), Options{Root: testdaemon.RepoRoot(t), Module: dir, Packages: pkgs,
		Platforms: "linux/amd64", OutDir: out, Progress: "plain", ProgressOut: &progress})
	return &moduleBuild{out: res, progress: progress.String(), dir: out}, err
}

func mustBuildModule(t *testing.T, dir string, pkgs ...string) *moduleBuild {
	t.Helper()
	b, err := buildModule(t, dir, pkgs...)
	if err != nil {
		t.Fatalf("build %s: %v", dir, err)
	}
	return b
}

// sent are the binaries the build sent, relative to its output folder:
// those whose bytes changed.
func (b *moduleBuild) sent() []string {
	var out []string
	for _, f := range b.out.Sent {
		rel, _ := filepath.Rel(b.out.Dir, f)
		out = append(out, rel)
	}
	return out
}

// runs runs a built binary and checks what it prints.
func (b *moduleBuild) runs(t *testing.T, name, want string) {
	t.Helper()
	got, err := exec.Command(filepath.Join(b.out.Dir, "linux_amd64", name)).CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != want {
		t.Errorf("%s printed %q (%v), want %q", name, got, err, want)
	}
}

func modulePlan(t *testing.T, dir string, pkgs ...string) *plan.Plan {
	t.Helper()
	p, err := Plan(Options{Root: testdaemon.RepoRoot(t), Module: dir, Packages: pkgs, Platforms: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// execOps marshals a binary's graph and returns its exec ops by name.
func execOps(t *testing.T, p *plan.Plan, fetch *golang.Fetch, binary string) (map[string]*pb.ExecOp, [][]byte) {
	t.Helper()
	g := image.NewGraph(p, nil, fetch)
	def, err := g.Binary(binary, amd64).Marshal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]*pb.ExecOp{}
	for _, dt := range def.Def {
		var op pb.Op
		if err := op.UnmarshalVT(dt); err != nil {
			t.Fatal(err)
		}
		if e := op.GetExec(); e != nil {
			ops[def.Metadata[digestOf(dt)].Description["llb.customname"]] = e
		}
	}
	return ops, def.Def
}

func TestModuleSources(t *testing.T) {
	daemon := testdaemon.Buildkit(t)

	t.Run("file proxy builds with no network in any step", func(t *testing.T) {
		app, proxy := greetApp(t, nil)
		t.Setenv("GOPROXY", "file://"+proxy)

		p := modulePlan(t, app, "./cmd/hello")
		if !slices.Equal(p.Modules, []string{"example.com/greet@v1.0.0"}) || p.ModMode != plan.ModReadonly {
			t.Fatalf("modules %v, mode %s; want example.com/greet@v1.0.0 with -mod=readonly", p.Modules, p.ModMode)
		}
		fetch, err := golang.ResolveFetch(context.Background(), t.TempDir(), p.Host().GoEnv)
		if err != nil {
			t.Fatal(err)
		}
		if !fetch.Offline || len(fetch.Proxies) != 1 {
			t.Fatalf("fetch offline=%t proxies=%v, want offline with one directory", fetch.Offline, fetch.Proxies)
		}
		ops, raw := execOps(t, p, fetch, "hello")
		if _, ok := ops["[go] go mod download"]; !ok {
			t.Fatalf("no download step among %v", slices.Collect(mapsKeys(ops)))
		}
		for name, e := range ops {
			if e.Network != pb.NetMode_NONE {
				t.Errorf("%s has network %s", name, e.Network)
			}
		}
		for _, dt := range raw {
			if bytes.Contains(dt, []byte(proxy)) {
				t.Errorf("the proxy's host path %s reached the definition", proxy)
			}
		}

		b := mustBuildModule(t, app, "./cmd/hello")
		b.runs(t, "hello", "hello from greet v1.0.0")
		if len(b.out.Steps.Ran("go mod download")) == 0 {
			t.Error("the download step did not run")
		}
	})

	t.Run("vendor directory: no download step, vendored files are inputs", func(t *testing.T) {
		app, proxy := greetApp(t, map[string]string{
			"cmd/plain/main.go":       plainMain,
			"cmd/indirect/main.go":    mainUsing("example.com/app/internal/relay"),
			"internal/relay/relay.go": "package relay\n\nimport \"example.com/greet\"\n\nfunc Hello() string { return greet.Hello() }\n",
		})
		modfixture.Go(t, app, []string{"GOPROXY=file://" + proxy}, "mod", "vendor")
		t.Setenv("GOPROXY", "off") // nothing may be fetched

		p := modulePlan(t, app, "./cmd/hello", "./cmd/plain", "./cmd/indirect")
		// A package imported through another is an input too.
		for _, f := range []string{"internal/relay/relay.go", "vendor/example.com/greet/greet.go"} {
			if !slices.Contains(p.Binary("indirect").Files, f) {
				t.Errorf("indirect's inputs lack %s: %v", f, p.Binary("indirect").Files)
			}
		}
		if p.ModMode != plan.ModVendor || len(p.Modules) != 0 {
			t.Fatalf("mode %s, modules %v; want vendor and none to download", p.ModMode, p.Modules)
		}
		if !slices.Contains(p.Binary("hello").Files, "vendor/example.com/greet/greet.go") {
			t.Errorf("hello's inputs lack the vendored package: %v", p.Binary("hello").Files)
		}
		if slices.Contains(p.Binary("plain").Files, "vendor/example.com/greet/greet.go") {
			t.Errorf("plain does not import greet, yet it is among its inputs")
		}
		ops, _ := execOps(t, p, nil, "hello")
		for name, e := range ops {
			if strings.Contains(name, "download") || e.Network != pb.NetMode_NONE {
				t.Errorf("step %s (network %s) in a vendored build", name, e.Network)
			}
			if name != "[go] build kilnstep" && !slices.Contains(e.Meta.Env, "GOFLAGS=-mod=vendor") {
				t.Errorf("%s: env %v lacks GOFLAGS=-mod=vendor", name, e.Meta.Env)
			}
		}

		b := mustBuildModule(t, app, "./cmd/hello", "./cmd/plain")
		b.runs(t, "hello", "hello from greet v1.0.0")
		b.runs(t, "plain", "plain")

		vendored := filepath.Join(app, "vendor", "example.com", "greet", "greet.go")
		if err := os.WriteFile(vendored, []byte(strings.ReplaceAll(greetV1.Files["greet.go"], "v1.0.0", "vendored edit")), 0o644); err != nil {
			t.Fatal(err)
		}
		again, err := buildModuleInto(t, b.dir, app, "./cmd/hello", "./cmd/plain")
		if err != nil {
			t.Fatal(err)
		}
		again.runs(t, "hello", "hello from greet vendored edit")
		if sent := again.sent(); !slices.Equal(sent, []string{"linux_amd64/hello"}) {
			t.Errorf("after a vendored edit these binaries were sent again: %v; want hello alone", sent)
		}

		// vendor/ travels as one archive, written again when a file's stat
		// changes: an edit that keeps the size and the modification time
		// still changes the change time. A stat is trusted at once here
		// (else only once two seconds old), so the archive is recorded.
		defer TrustRecentInputs()()
		if _, err := buildModuleInto(t, b.dir, app, "./cmd/hello", "./cmd/plain"); err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(vendored)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vendored, []byte(strings.ReplaceAll(greetV1.Files["greet.go"], "v1.0.0", "VENDORED EDIT")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(vendored, info.ModTime(), info.ModTime()); err != nil {
			t.Fatal(err)
		}
		if after, err := os.Stat(vendored); err != nil || after.Size() != info.Size() || !after.ModTime().Equal(info.ModTime()) {
			t.Fatalf("the edit changed the size or time (%v, %v): the test proves nothing", after, err)
		}
		same, err := buildModuleInto(t, b.dir, app, "./cmd/hello", "./cmd/plain")
		if err != nil {
			t.Fatal(err)
		}
		same.runs(t, "hello", "hello from greet VENDORED EDIT")

		if err := os.WriteFile(filepath.Join(app, "vendor", "modules.txt"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = Plan(Options{Root: testdaemon.RepoRoot(t), Module: app, Packages: []string{"./cmd/hello"}, Platforms: "linux/amd64"})
		if err == nil || !strings.Contains(err.Error(), "inconsistent vendoring") || !strings.Contains(err.Error(), "run `go mod vendor`") {
			t.Errorf("inconsistent vendor directory gave %v; want it named with the fix", err)
		}
	})

	t.Run("embedded directory trees, in the main module and in a vendored module", func(t *testing.T) {
		isolateGo(t)
		proxy := tempDir(t)
		assets := modfixture.Module{Path: "example.com/assets", Version: "v1.0.0", Files: map[string]string{
			"go.mod": "module example.com/assets\n\ngo 1.26\n",
			"assets.go": "package assets\n\nimport \"embed\"\n\n//go:embed translations\nvar fs embed.FS\n\n" +
				"func Hello() string { b, _ := fs.ReadFile(\"translations/en/hello.txt\"); return string(b) }\n",
			"translations/en/hello.txt": "hello from a vendored embed",
		}}
		sums := modfixture.Proxy(t, proxy, assets)
		app := t.TempDir()
		modfixture.Write(t, app, map[string]string{
			"go.mod":               "module example.com/app\n\ngo 1.26\n\nrequire example.com/assets v1.0.0\n",
			"go.sum":               sums,
			"cmd/vendored/main.go": mainUsing("example.com/assets"),
			"cmd/local/main.go":    mainUsing("example.com/app/internal/local"),
			"internal/local/local.go": "package local\n\nimport \"embed\"\n\n//go:embed templates/*/*.txt\nvar fs embed.FS\n\n" +
				"func Hello() string { b, _ := fs.ReadFile(\"templates/greeting/hello.txt\"); return string(b) }\n",
			"internal/local/templates/greeting/hello.txt": "hello from a local embed",
			"cmd/plain/main.go":                           plainMain,
		})
		t.Setenv("GOPROXY", "file://"+proxy)
		modfixture.Go(t, app, nil, "mod", "vendor")

		p := modulePlan(t, app, "./cmd/vendored", "./cmd/local", "./cmd/plain")
		for bin, file := range map[string]string{"vendored": "vendor/example.com/assets/translations/en/hello.txt", "local": "internal/local/templates/greeting/hello.txt"} {
			if !slices.Contains(p.Binary(bin).Files, file) {
				t.Errorf("%s's inputs lack the embedded %s: %v", bin, file, p.Binary(bin).Files)
			}
		}
		b := mustBuildModule(t, app, "./cmd/vendored", "./cmd/local", "./cmd/plain")
		b.runs(t, "vendored", "hello from a vendored embed")
		b.runs(t, "local", "hello from a local embed")

		if err := os.WriteFile(filepath.Join(app, "internal/local/templates/greeting/hello.txt"), []byte("edited embed"), 0o644); err != nil {
			t.Fatal(err)
		}
		again, err := buildModuleInto(t, b.dir, app, "./cmd/vendored", "./cmd/local", "./cmd/plain")
		if err != nil {
			t.Fatal(err)
		}
		again.runs(t, "local", "edited embed")
		if sent := again.sent(); !slices.Equal(sent, []string{"linux_amd64/local"}) {
			t.Errorf("after an edit to an embedded file these binaries were sent again: %v; want local alone", sent)
		}
	})

	t.Run("go.work: a binary from each module", func(t *testing.T) {
		isolateGo(t)
		proxy := tempDir(t)
		sums := modfixture.Proxy(t, proxy, greetV1)
		ws := t.TempDir()
		modfixture.Write(t, ws, map[string]string{
			"go.work":             "go 1.26\n\nuse (\n\t./a\n\t./b\n)\n",
			"a/go.mod":            "module example.com/a\n\ngo 1.26\n",
			"a/cmd/alpha/main.go": plainMain,
			"b/go.mod":            "module example.com/b\n\ngo 1.26\n\nrequire example.com/greet v1.0.0\n",
			"b/go.sum":            sums,
			"b/cmd/beta/main.go":  mainUsing("example.com/greet"),
		})
		t.Setenv("GOPROXY", "file://"+proxy)

		p := modulePlan(t, ws, "./a/cmd/alpha", "./b/cmd/beta")
		if !p.Workspace || p.Binary("alpha").Module != "example.com/a" || p.Binary("beta").Module != "example.com/b" {
			t.Fatalf("workspace=%t alpha from %q beta from %q", p.Workspace, p.Binary("alpha").Module, p.Binary("beta").Module)
		}
		if beta := p.Binary("beta"); beta.Package != "./b/cmd/beta" {
			t.Errorf("the plan does not say where beta comes from: package %q", beta.Package)
		}
		b := mustBuildModule(t, ws, "./a/cmd/alpha", "./b/cmd/beta")
		b.runs(t, "alpha", "plain")
		b.runs(t, "beta", "hello from greet v1.0.0")
	})

	t.Run("private module over SSH agent forwarding, netrc never leaks", func(t *testing.T) {
		isolateGo(t)
		srv := modfixture.StartGitServer(t)
		const modPath = "git.kiln.test/private/greet.git"
		srv.Repo(t, "private/greet.git", "v1.0.0", map[string]string{
			"go.mod":   "module " + modPath + "\n\ngo 1.26\n",
			"greet.go": "package greet\n\nfunc Hello() string { return \"hello from a private module\" }\n",
		})
		home := srv.ClientHome(t, "git.kiln.test")
		canary := "KILN-CANARY-" + strings.ReplaceAll(t.Name(), "/", "-")[:12] + "-7d1f0c"
		// The private host's entry is forwarded (as a secret), an unrelated
		// host's never is.
		modfixture.Write(t, home, map[string]string{".netrc": "machine git.kiln.test login kiln password " + canary + "\nmachine unrelated.invalid login x password UNRELATED-CANARY\n"})
		os.Chmod(filepath.Join(home, ".netrc"), 0o600)
		cache, err := buildkit.CacheDir() // the toolchain is there, under the real home
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("KILN_CACHE_DIR", cache)
		t.Setenv("HOME", home)
		t.Setenv("GIT_CONFIG_GLOBAL", "")
		os.Unsetenv("GIT_CONFIG_GLOBAL") // empty would mean no global config
		t.Setenv("SSH_AUTH_SOCK", srv.AgentSocket)
		t.Setenv("GOPRIVATE", "git.kiln.test")
		t.Setenv("GOPROXY", "off")

		app := t.TempDir()
		modfixture.Write(t, app, map[string]string{
			"go.mod":            "module example.com/app\n\ngo 1.26\n",
			"cmd/hello/main.go": mainUsing(modPath),
		})
		// The host's ssh reads the passwd home, not HOME: point it at the test's.
		sshCmd := "GIT_SSH_COMMAND=ssh -F " + home + "/.ssh/config -o UserKnownHostsFile=" + home + "/.ssh/known_hosts"
		modfixture.Go(t, app, []string{"GOFLAGS=-mod=mod -modcacherw", sshCmd}, "mod", "tidy")

		b := mustBuildModule(t, app, "./cmd/hello")
		b.runs(t, "hello", "hello from a private module")
		if len(b.out.Steps.Ran("go mod download")) == 0 {
			t.Fatal("the download step did not run")
		}

		// The canary is in no definition, progress output, output file or daemon state.
		p := modulePlan(t, app, "./cmd/hello")
		fetch, err := golang.ResolveFetch(context.Background(), t.TempDir(), p.Host().GoEnv)
		if err != nil {
			t.Fatal(err)
		}
		if !fetch.Direct || fetch.Tools == "" || fetch.SSHAgent == "" {
			t.Errorf("fetch direct=%t tools=%q agent=%q; want git tools and the agent", fetch.Direct, fetch.Tools, fetch.SSHAgent)
		}
		if !bytes.Contains(fetch.Secrets["kiln-netrc"], []byte(canary)) {
			t.Fatal("the netrc was not picked up as a secret; the leak checks below would prove nothing")
		}
		if bytes.Contains(fetch.Secrets["kiln-netrc"], []byte("UNRELATED-CANARY")) {
			t.Error("the netrc entry of a host no module lives on was forwarded")
		}
		_, raw := execOps(t, p, fetch, "hello")
		for _, dt := range raw {
			if bytes.Contains(dt, []byte(canary)) {
				t.Error("the netrc credential reached the LLB definition")
			}
		}
		if strings.Contains(b.progress, canary) {
			t.Error("the netrc credential reached the progress output")
		}
		for _, dir := range []string{b.dir, daemon.Managed.(*managed.Managed).Dir} {
			if path := fileContaining(t, dir, canary); path != "" {
				t.Errorf("the netrc credential is in %s", path)
			}
		}
	})

	t.Run("module errors name the module and the remedy", func(t *testing.T) {
		isolateGo(t)
		refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "gone", http.StatusGone)
		}))
		defer refusing.Close()
		refused := modfixture.Module{Path: "example.com/refused", Version: "v1.2.3", Files: map[string]string{
			"go.mod":   "module example.com/refused\n\ngo 1.26\n",
			"greet.go": "package greet\n\nfunc Hello() string { return \"never\" }\n",
		}}
		proxy := tempDir(t)
		sums := modfixture.Proxy(t, proxy, refused)
		app := t.TempDir()
		modfixture.Write(t, app, map[string]string{
			"go.mod":            "module example.com/app\n\ngo 1.26\n\nrequire example.com/refused v1.2.3\n",
			"go.sum":            sums,
			"cmd/hello/main.go": mainUsing("example.com/refused"),
		})
		wantRefused := func(t *testing.T, err error) {
			t.Helper()
			if err == nil {
				t.Fatal("a refused module built")
			}
			t.Logf("error shown: %v", err)
			for _, want := range []string{"example.com/refused@v1.2.3", refusing.URL, "410 Gone", "GOPRIVATE", "file:// GOPROXY", "go mod vendor"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, err)
				}
			}
		}
		t.Setenv("GOPROXY", refusing.URL)
		t.Run("in the plan", func(t *testing.T) {
			_, err := Plan(Options{Root: testdaemon.RepoRoot(t), Module: app, Packages: []string{"./cmd/hello"}, Platforms: "linux/amd64"})
			wantRefused(t, err)
		})
		t.Run("in the download step", func(t *testing.T) {
			// The host has the module cached; the daemon must ask the proxy.
			modfixture.Go(t, app, []string{"GOPROXY=file://" + proxy}, "mod", "download")
			_, err := buildModule(t, app, "./cmd/hello")
			wantRefused(t, err)
			if err != nil && !strings.Contains(err.Error(), "[go] go mod download failed") {
				t.Errorf("the error does not name the download step: %v", err)
			}
		})
		t.Run("go.sum mismatch", func(t *testing.T) {
			isolateGo(t)
			t.Setenv("GOPROXY", "file://"+proxy)
			bad := strings.Replace(sums, " h1:", " h1:AAAA", 1)
			modfixture.Write(t, app, map[string]string{"go.sum": bad})
			_, err := Plan(Options{Root: testdaemon.RepoRoot(t), Module: app, Packages: []string{"./cmd/hello"}, Platforms: "linux/amd64"})
			t.Logf("error shown: %v", err)
			if err == nil || !strings.Contains(err.Error(), "module example.com/refused@v1.2.3: its content does not match go.sum") {
				t.Errorf("a go.sum mismatch gave %v; want the module named", err)
			}
		})
	})
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// tempDir is a temporary directory with a plain name: t.TempDir's can hold
// characters that a file:// URL reads differently.
func tempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "kiln-goproxy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fileContaining returns a regular file under dir that contains s, or "".
func fileContaining(t *testing.T, dir, s string) string {
	t.Helper()
	found := ""
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return nil
		}
		if dt, err := os.ReadFile(path); err == nil && bytes.Contains(dt, []byte(s)) {
			found = path
		}
		return nil
	})
	return found
}

func digestOf(dt []byte) digest.Digest { return digest.FromBytes(dt) }
