package session_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

func TestRemoteDaemonOverMutualTLS(t *testing.T) {
	d := testdaemon.TLSBuildkit(t)
	t.Setenv(buildkit.HostEnv, d.Addr)
	// The subject is the connection: a one-package module builds on it.
	module := t.TempDir()
	modfixture.Write(t, module, map[string]string{
		"go.mod":            "module example.com/hello\n\ngo 1.26\n",
		"cmd/hello/main.go": "package main\n\nimport \"runtime\"\n\nfunc main() { println(runtime.GOOS + \"/\" + runtime.GOARCH) }\n",
	})
	opts := session.Options{Root: testdaemon.RepoRoot(t), Module: module, Packages: []string{"./cmd/hello"}, Platforms: "linux/amd64", Progress: "quiet"}
	binaries := func(t *testing.T) error {
		o := opts
		o.OutDir = t.TempDir()
		out, err := session.Binaries(context.Background(), o)
		if err != nil {
			return err
		}
		got, err := exec.Command(filepath.Join(out.Dir, "linux_amd64", "hello")).CombinedOutput()
		if err != nil || !strings.Contains(string(got), "linux/amd64") {
			t.Errorf("hello built on the TLS daemon printed %q (%v)", got, err)
		}
		return nil
	}

	t.Run("client certificate from the daemon's CA builds", func(t *testing.T) {
		t.Setenv(buildkit.TLSDirEnv, d.ClientDir)
		if err := binaries(t); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("certificate files named one by one", func(t *testing.T) {
		t.Setenv(buildkit.TLSCACertEnv, filepath.Join(d.ClientDir, "ca.pem"))
		t.Setenv(buildkit.TLSCertEnv, filepath.Join(d.ClientDir, "cert.pem"))
		t.Setenv(buildkit.TLSKeyEnv, filepath.Join(d.ClientDir, "key.pem"))
		if err := binaries(t); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"certificate of another CA", map[string]string{buildkit.TLSDirEnv: d.StrangerDir}, []string{"refused the TLS connection", d.Addr, buildkit.TLSCertEnv}},
		{"no client certificate", map[string]string{buildkit.TLSCACertEnv: filepath.Join(d.ClientDir, "ca.pem")}, []string{"refused the TLS connection", d.Addr}},
		{"no TLS at all", nil, []string{d.Addr, buildkit.TLSDirEnv}},
		{"unreadable key", map[string]string{buildkit.TLSCertEnv: filepath.Join(d.ClientDir, "cert.pem"), buildkit.TLSKeyEnv: "/nonexistent/key.pem"}, []string{buildkit.TLSKeyEnv, "/nonexistent/key.pem"}},
		{"certificate without key", map[string]string{buildkit.TLSCertEnv: filepath.Join(d.ClientDir, "cert.pem")}, []string{buildkit.TLSKeyEnv}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			o := opts
			o.OutDir = t.TempDir()
			_, err := session.Binaries(context.Background(), o)
			if err == nil {
				t.Fatal("the build succeeded")
			}
			t.Logf("error shown: %v", err)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
		})
	}
}
