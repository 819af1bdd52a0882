package testdaemon

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/buildkit/managed"
)

// TLSDaemon is a buildkitd on 127.0.0.1 that takes only clients holding a
// certificate from its CA, as a remote daemon would.
type TLSDaemon struct {
	Addr string
	// ClientDir holds ca.pem, cert.pem and key.pem of an accepted client.
	ClientDir string
	// StrangerDir holds the same files for a client of another CA.
	StrangerDir string
}

// TLSBuildkit starts the daemon with certificates the test generates.
func TLSBuildkit(t *testing.T) *TLSDaemon {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs buildkitd")
	}
	m, err := managed.DefaultManaged(RepoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureBinary(t.Context()); err != nil {
		Unavailable(t, "cannot build buildkitd: %v", err)
	}
	dir, err := os.MkdirTemp("", "kiln-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	ca, caKey := newCA(t, "kiln test CA")
	server := filepath.Join(dir, "server")
	writeCert(t, server, ca, caKey, ca, x509.ExtKeyUsageServerAuth)
	d := &TLSDaemon{ClientDir: filepath.Join(dir, "client"), StrangerDir: filepath.Join(dir, "stranger")}
	writeCert(t, d.ClientDir, ca, caKey, ca, x509.ExtKeyUsageClientAuth)
	other, otherKey := newCA(t, "another CA")
	writeCert(t, d.StrangerDir, other, otherKey, ca, x509.ExtKeyUsageClientAuth)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hostport := l.Addr().String()
	l.Close()
	d.Addr = "tcp://" + hostport
	log, err := os.Create(filepath.Join(dir, "buildkitd.log"))
	if err != nil {
		t.Fatal(err)
	}
	config, err := m.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(m.Binary(), "--root", filepath.Join(dir, "state"), "--addr", d.Addr, "--config", config,
		"--oci-worker=true",
		"--tlscacert", filepath.Join(server, "ca.pem"), "--tlscert", filepath.Join(server, "cert.pem"), "--tlskey", filepath.Join(server, "key.pem"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		Unavailable(t, "start buildkitd with TLS: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", hostport, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			dt, _ := os.ReadFile(log.Name())
			Unavailable(t, "buildkitd with TLS did not listen on %s:\n%s", hostport, dt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return d
}

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

// writeCert writes ca.pem (trust), cert.pem and key.pem (signed by signer) into dir.
func writeCert(t *testing.T, dir string, signer *x509.Certificate, signerKey *ecdsa.PrivateKey, trust *x509.Certificate, usage x509.ExtKeyUsage, ips ...net.IP) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: filepath.Base(dir)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: append([]net.IP{net.ParseIP("127.0.0.1")}, ips...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	os.MkdirAll(dir, 0o700)
	for name, block := range map[string]*pem.Block{
		"ca.pem":   {Type: "CERTIFICATE", Bytes: trust.Raw},
		"cert.pem": {Type: "CERTIFICATE", Bytes: der},
		"key.pem":  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
