package golang

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/plan"
)

// A canary credential for a host the download never contacts must not be
// handed to the daemon, nor git and SSH credentials when no module is private.
func TestDownloadCredentialsStayWithTheHostsThatNeedThem(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("NETRC", "")
	t.Setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
	t.Setenv(ForwardGitEnv, "")
	netrc := "machine proxy.example login u password proxy-pass\n" +
		"machine unrelated.example login canary password canary-pass\n" +
		"machine git.corp.example login g password git-pass\n" +
		"default login any password default-pass\n"
	os.WriteFile(filepath.Join(home, ".netrc"), []byte(netrc), 0o600)
	os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[url \"ssh://git@git.corp.example/\"]\n\tinsteadOf = https://git.corp.example/\n"), 0o600)

	t.Setenv("GOPROXY", "https://proxy.example,direct")
	t.Setenv("GOPRIVATE", "")
	t.Setenv("GONOPROXY", "")
	f, err := ResolveFetch(context.Background(), t.TempDir(), hostGoEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	secret := string(f.Secrets["kiln-netrc"])
	if !strings.Contains(secret, "proxy-pass") || strings.Contains(secret, "canary") || strings.Contains(secret, "git-pass") || strings.Contains(secret, "default-pass") {
		t.Errorf("netrc secret with no private modules:\n%s", secret)
	}
	if f.SSHAgent != "" || f.Secrets["kiln-gitconfig"] != nil {
		t.Errorf("git credentials forwarded with no private modules: agent %q, gitconfig %t", f.SSHAgent, f.Secrets["kiln-gitconfig"] != nil)
	}

	t.Setenv("GOPRIVATE", "git.corp.example/team/*")
	f, err = ResolveFetch(context.Background(), t.TempDir(), hostGoEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	secret = string(f.Secrets["kiln-netrc"])
	if !strings.Contains(secret, "git-pass") || strings.Contains(secret, "canary") {
		t.Errorf("netrc secret with private modules:\n%s", secret)
	}
	if f.SSHAgent == "" || f.Secrets["kiln-gitconfig"] == nil {
		t.Error("git credentials not forwarded for private modules")
	}
}

// The host's build flags do not reach the download step, whose key they
// would change for the same modules.
func TestDownloadStepTakesNoHostBuildFlags(t *testing.T) {
	t.Setenv("GOFLAGS", "-gcflags=all=-N -mod=mod -trimpath")
	f, err := ResolveFetch(context.Background(), t.TempDir(), hostGoEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, kv := range f.Env {
		if strings.HasPrefix(kv, "GOFLAGS=") {
			flags = append(flags, kv)
		}
	}
	if !slices.Equal(flags, []string{"GOFLAGS=-modcacherw"}) {
		t.Errorf("the download step's GOFLAGS: %q, want only -modcacherw", flags)
	}
}

func TestVCSToolsAreFoundAgainOnlyWhileEveryFileIsAsItWas(t *testing.T) {
	cache := t.TempDir()
	bin := filepath.Join(t.TempDir(), "git")
	lib := filepath.Join(t.TempDir(), "libgit.so")
	for _, f := range []string{bin, lib} {
		if err := os.WriteFile(f, []byte("v1"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	paths := []string{bin, lib}
	dir, err := vcsToolsDir(cache, paths)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(cache, "vcs-tools", "index.json")
	helpers := t.TempDir()
	writeVCSToolsIndex(index, vcsToolsIndex{Bins: []string{bin}, Env: vcsToolsEnv(), ExecDir: helpers, ExecDirMod: modTime(helpers), Paths: paths, Dir: dir})

	if got, ok := knownVCSTools(cache, index, []string{bin}); !ok || got != dir {
		t.Fatalf("unchanged tools: got %q, %v; want %q", got, ok, dir)
	}
	if _, ok := knownVCSTools(cache, index, []string{bin, "/usr/bin/ssh"}); ok {
		t.Error("found again although ssh appeared")
	}
	before := os.Getenv("LD_LIBRARY_PATH")
	t.Setenv("LD_LIBRARY_PATH", "/opt/other")
	if _, ok := knownVCSTools(cache, index, []string{bin}); ok {
		t.Error("found again although LD_LIBRARY_PATH changed")
	}
	t.Setenv("LD_LIBRARY_PATH", before)
	// A library upgraded in place: git is the same file, its library is not.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(lib, later, later); err != nil {
		t.Fatal(err)
	}
	if _, ok := knownVCSTools(cache, index, []string{bin}); ok {
		t.Error("found again although a library changed")
	}
}

// hostGoEnv is the module environment a build reads before its plan.
func hostGoEnv(t *testing.T) map[string]string {
	t.Helper()
	env, err := plan.ModuleEnvOf("")
	if err != nil {
		t.Fatal(err)
	}
	return env
}
