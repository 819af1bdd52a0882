package testdaemon

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
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
	// CAFile is the CA that signed a TLS registry's certificate.
	CAFile string
	dir    string
	cmd    *exec.Cmd
	t      *testing.T
	scheme string
	https  *http.Client
}

func (r *Registry) client() *http.Client {
	if r.https != nil {
		return r.https
	}
	return http.DefaultClient
}

// StartRegistry starts Debian's docker-registry with its own storage and
// credentials, and writes a DOCKER_CONFIG holding them for the test.
func StartRegistry(t *testing.T) *Registry {
	t.Helper()
	return startRegistry(t, "127.0.0.1", false)
}

// StartTLSRegistry starts a registry that serves HTTPS, with a certificate
// from a CA of the test's own (CAFile), on this machine's first address
// that is not loopback: BuildKit reaches loopback registries over plain
// HTTP, so only another address exercises certificate checks.
func StartTLSRegistry(t *testing.T) *Registry {
	t.Helper()
	return startRegistry(t, hostIP(t), true)
}

func hostIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	Unavailable(t, "no non-loopback IPv4 address for a TLS registry")
	return ""
}

func startRegistry(t *testing.T, ip string, useTLS bool) *Registry {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs a registry")
	}
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		Unavailable(t, "docker-registry not found: apt-get install -y docker-registry")
	}
	_ = bin
	r := &Registry{User: "kiln", Pass: "canary-pass-" + fmt.Sprint(time.Now().UnixNano()), dir: t.TempDir(), t: t, scheme: "http"}
	ln, err := net.Listen("tcp", ip+":0")
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
	if useTLS {
		ca, caKey := newCA(t, "kiln test registry CA")
		certs := filepath.Join(r.dir, "tls")
		writeCert(t, certs, ca, caKey, ca, x509.ExtKeyUsageServerAuth, net.ParseIP(ip))
		r.CAFile, r.scheme = filepath.Join(certs, "ca.pem"), "https"
		config, err := os.ReadFile(filepath.Join(r.dir, "config.yml"))
		if err != nil {
			t.Fatal(err)
		}
		tlsBlock := fmt.Sprintf("  addr: %s\n  tls:\n    certificate: %s\n    key: %s\n", r.Addr, filepath.Join(certs, "cert.pem"), filepath.Join(certs, "key.pem"))
		write(t, filepath.Join(r.dir, "config.yml"), strings.Replace(string(config), "  addr: "+r.Addr+"\n", tlsBlock, 1))
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		r.https = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	// A test with two registries needs the credentials of both.
	auths := map[string]map[string]string{}
	if prev, err := os.ReadFile(filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json")); err == nil && os.Getenv("DOCKER_CONFIG") != "" {
		var cfg struct {
			Auths map[string]map[string]string `json:"auths"`
		}
		if json.Unmarshal(prev, &cfg) == nil && cfg.Auths != nil {
			auths = cfg.Auths
		}
	}
	auths[r.Addr] = map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(r.User + ":" + r.Pass))}
	docker := filepath.Join(r.dir, "docker")
	cfg, _ := json.Marshal(map[string]any{"auths": auths})
	write(t, filepath.Join(docker, "config.json"), string(cfg))
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
		resp, err := r.client().Get(r.scheme + "://" + r.Addr + "/v2/")
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
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf(r.scheme+"://%s/v2/%s/manifests/%s", r.Addr, name, ref), nil)
	if err != nil {
		return "", "", nil, err
	}
	req.SetBasicAuth(r.User, r.Pass)
	req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json")
	resp, err := r.client().Do(req)
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
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf(r.scheme+"://%s/v2/%s/blobs/%s", r.Addr, name, digest), nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(r.User, r.Pass)
	resp, err := r.client().Do(req)
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
