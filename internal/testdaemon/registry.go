package testdaemon

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Registry is a distribution registry on 127.0.0.1 that a test started,
// with basic auth from an htpasswd file.
type Registry struct {
	Addr       string
	User, Pass string
	dir        string
	cmd        *exec.Cmd
	t          *testing.T
}

// StartRegistry starts Debian's docker-registry with its own storage and
// credentials, and writes a DOCKER_CONFIG holding them for the test.
func StartRegistry(t *testing.T) *Registry {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs a registry")
	}
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		Unavailable(t, "docker-registry not found: apt-get install -y docker-registry")
	}
	_ = bin
	r := &Registry{User: "kiln", Pass: "canary-pass-" + fmt.Sprint(time.Now().UnixNano()), dir: t.TempDir(), t: t}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.Addr = ln.Addr().String()
	ln.Close()
	hash, err := bcrypt.GenerateFromPassword([]byte(r.Pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(r.dir, "htpasswd"), fmt.Sprintf("%s:%s\n", r.User, hash))
	write(t, filepath.Join(r.dir, "config.yml"), fmt.Sprintf(`version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
auth:
  htpasswd:
    realm: kiln-test
    path: %s
`, filepath.Join(r.dir, "data"), r.Addr, filepath.Join(r.dir, "htpasswd")))
	docker := filepath.Join(r.dir, "docker")
	auth := base64.StdEncoding.EncodeToString([]byte(r.User + ":" + r.Pass))
	write(t, filepath.Join(docker, "config.json"), fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, r.Addr, auth))
	t.Setenv("DOCKER_CONFIG", docker)
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Start (re)starts the registry process and waits until it answers.
func (r *Registry) Start() {
	r.t.Helper()
	r.cmd = exec.Command("docker-registry", "serve", filepath.Join(r.dir, "config.yml"))
	r.cmd.Stdout, r.cmd.Stderr = os.Stderr, os.Stderr
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + r.Addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("registry on %s did not answer: %v", r.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the registry process.
func (r *Registry) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

// Manifest fetches a manifest or index by reference and returns its digest
// and media type, as a client pulling it would see them.
func (r *Registry) Manifest(name, ref string) (digest, mediaType string, body []byte, err error) {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v2/%s/manifests/%s", r.Addr, name, ref), nil)
	if err != nil {
		return "", "", nil, err
	}
	req.SetBasicAuth(r.User, r.Pass)
	req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", nil, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if rerr != nil {
			break
		}
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", nil, fmt.Errorf("GET manifest %s:%s: %s", name, ref, resp.Status)
	}
	return resp.Header.Get("Docker-Content-Digest"), resp.Header.Get("Content-Type"), buf, nil
}

// Blob fetches a blob of a repository.
func (r *Registry) Blob(name, digest string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v2/%s/blobs/%s", r.Addr, name, digest), nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(r.User, r.Pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET blob %s@%s: %s", name, digest, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// BlobPath is where the registry stores a blob (sha256:...) on disk, for
// tests that corrupt one.
func (r *Registry) BlobPath(dg string) string {
	hex := strings.TrimPrefix(dg, "sha256:")
	return filepath.Join(r.dir, "data", "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data")
}
