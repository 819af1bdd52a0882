package buildkit

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/moby/buildkit/session/auth/authprovider"
)

func TestRegistryHostIsTheHostTheUserGave(t *testing.T) {
	for _, tc := range []struct {
		in, want  string
		plainHTTP bool
	}{
		{"127.0.0.1:5000", "127.0.0.1:5000", true},
		{"localhost:5000/team", "localhost:5000/team", true},
		{"registry.example.com/antrea", "registry.example.com/antrea", false},
		{"buildhost:5000", "buildhost:5000", false},
	} {
		got, plain, err := RegistryHost(tc.in)
		if err != nil || got != tc.want || plain != tc.plainHTTP {
			t.Errorf("RegistryHost(%q) = %q, %t, %v; want %q, %t", tc.in, got, plain, err, tc.want, tc.plainHTTP)
		}
	}
	for _, bad := range []string{"buildhost", "buildhost/team", "Not A Registry"} {
		if _, _, err := RegistryHost(bad); err == nil {
			t.Errorf("RegistryHost(%q) was accepted", bad)
		} else if bad == "buildhost" && !strings.Contains(err.Error(), "docker.io") {
			t.Errorf("RegistryHost(%q): %v; want it to say it would go to docker.io", bad, err)
		}
	}
}

func TestRegistryOfReadsTheHostAsTheReferenceGrammarDoes(t *testing.T) {
	for ref, want := range map[string]string{
		"192.0.2.2:46045/antrea":                   "192.0.2.2:46045",
		"registry.example/antrea/base:1@sha256:ab": "registry.example",
		"localhost/x":                              "localhost",
		"busybox:1":                                "docker.io",
		"library/busybox":                          "docker.io",
	} {
		if got := RegistryOf(ref); got != want {
			t.Errorf("RegistryOf(%q) = %q, want %q", ref, got, want)
		}
	}
}

// TestALayerCacheNamesItsRegistry: a registry layer cache whose ref names
// no registry host (buildcache/kiln) is a Docker Hub repository to the
// reference grammar, which the build would send Docker Hub's credentials
// to; it is refused as -registry is, naming where it was set.
func TestALayerCacheNamesItsRegistry(t *testing.T) {
	for _, tc := range []struct{ flag, configured, want string }{
		{"type=registry,ref=buildcache/kiln", "", "-cachefrom: ref=buildcache/kiln"},
		{"type=registry,ref=buildcache/kiln:main,mode=max", "", "give the registry host"},
		{"", "type=registry,ref=cache", "kiln.yaml cache"},
	} {
		if _, err := CacheEntries(tc.flag, tc.configured, "-cachefrom"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CacheEntries(%q, %q): %v; want it refused, naming %q", tc.flag, tc.configured, err, tc.want)
		}
	}
	for _, ok := range []string{"type=registry,ref=localhost:5000/cache", "type=registry,ref=docker.io/team/cache", "type=registry,ref=index.docker.io/team/cache", "type=registry,ref=registry.example.com/team/cache:main,mode=max", "type=local,dest=/tmp/c", "type=inline"} {
		if _, err := CacheEntries(ok, "", "-cachefrom"); err != nil {
			t.Errorf("CacheEntries(%q): %v", ok, err)
		}
	}
}

// TestSkippingTheCertificateCheckKeepsHTTPS: -skiptlsverify skips the
// check of a registry's certificate and nothing else: kiln's own client
// still speaks HTTPS to it (credentials never go out in clear text), and
// without the flag a certificate no CA here signed is refused.
func TestSkippingTheCertificateCheckKeepsHTTPS(t *testing.T) {
	var overTLS, plain atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			overTLS.Add(1)
		} else {
			plain.Add(1)
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "https://")
	ref := host + "/team/image:tag"
	creds := func(string) (string, string, error) { return "user", "secret", nil }
	if _, _, err := Resolver(false, false, creds).Resolve(context.Background(), ref); err == nil || overTLS.Load() != 0 {
		t.Fatalf("a self-signed certificate was accepted without -skiptlsverify: %v, %d requests", err, overTLS.Load())
	}
	Resolver(false, true, creds).Resolve(context.Background(), ref)
	if overTLS.Load() == 0 || plain.Load() != 0 {
		t.Errorf("with -skiptlsverify: %d requests over TLS, %d in clear text; want TLS alone", overTLS.Load(), plain.Load())
	}
}

// TestDockerHubCredentialsAreFound: Docker stores Docker Hub's credentials
// under its legacy index URL; kiln's client, asked for the API host, finds
// them there as BuildKit's auth provider does.
func TestDockerHubCredentialsAreFound(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dir)
	auth := base64.StdEncoding.EncodeToString([]byte("hubuser:hubpass"))
	config := `{"auths":{"` + authprovider.DockerHubConfigfileKey + `":{"auth":"` + auth + `"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	user, pass, err := Credentials()(authprovider.DockerHubRegistryHost)
	if err != nil || user != "hubuser" || pass != "hubpass" {
		t.Errorf("Docker Hub's credentials: %q, %q, %v; want the ones the Docker config keeps", user, pass, err)
	}
}
